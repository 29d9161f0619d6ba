"""`salactl quantize --random-weights` falls back to random calibration ids only where the model has no
tokenizer; a --tokenizer the user gave that does not load is an error (exit 5), as in every other
command (it used to fall back too, with a note)."""

import json
import subprocess
import sys

from test_quantize_cli import small_config

CALIBRATED_RTN = ["--method", "rtn", "--kv-cache-dtype", "fp8_e4m3", "--nsamples", 2, "--seqlen", 32,
                  "--device", "cpu"]          # RTN with FP8 KV scales: calibrated, and quick


def salactl(*args):
    return subprocess.run([sys.executable, "-m", "salactl", *map(str, args)], capture_output=True, text=True,
                          timeout=300)


def _config_only(path):
    path.mkdir()
    (path / "config.json").write_text(json.dumps(small_config().replace(torch_dtype="float32").to_hf_dict()))
    return path


def test_a_given_tokenizer_that_fails_is_an_error_with_random_weights(tmp_path):
    model = _config_only(tmp_path / "m")
    r = salactl("quantize", "--random-weights", "--model", model, "--tokenizer", tmp_path / "none",
                "--out", tmp_path / "q", *CALIBRATED_RTN)
    assert r.returncode == 5, r.stderr
    # one line naming the path (the wording is runtime/tokenizer.py's)
    assert r.stderr.startswith("error: ") and r.stderr.count("\n") == 1 and str(tmp_path / "none") in r.stderr
    assert not (tmp_path / "q").exists()


def test_random_weights_without_any_tokenizer_still_calibrate_on_random_ids(tmp_path):
    model = _config_only(tmp_path / "m")
    r = salactl("quantize", "--random-weights", "--model", model, "--out", tmp_path / "q", "--json",
                *CALIBRATED_RTN)
    assert r.returncode == 0, r.stderr
    assert "note: no tokenizer for random weights; calibrating on random token ids" in r.stderr
    assert json.loads(r.stdout)["calibration"]["source"] == "random"

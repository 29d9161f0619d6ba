"""`salactl quantize` refuses before it loads any weights what would fail after (minutes at 9B), never
writes over the checkpoint it reads, and a write killed midway leaves nothing that outlives it."""

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import run_cli
from salactl.runtime.loader import EMBEDDED_DIR
from test_quantize_cli import small_config, write_random_checkpoint

TESTS = Path(__file__).resolve().parent


def _unloadable_checkpoint(path: Path, tokenizer: bool = True, quantized: bool = False) -> Path:
    """config.json (and the tokenizer) of a real checkpoint whose weights file is garbage: loading it
    fails with exit 4, so any other exit code comes from a check made before loading."""
    path.mkdir()
    config = small_config().to_hf_dict()
    if quantized:
        config["quantization_config"] = {"quant_method": "gptq", "bits": 4, "group_size": 128, "sym": True,
                                         "desc_act": False}
    (path / "config.json").write_text(json.dumps(config))
    (path / "model.safetensors").write_bytes(b"not safetensors")
    if tokenizer:
        (path / "tokenizer.json").write_bytes((EMBEDDED_DIR / "tokenizer.json").read_bytes())
    return path


@pytest.mark.parametrize("case, code, words", [
    ("no_tokenizer", 5, "has no tokenizer.json"),
    ("missing_calib", 7, "--calib"),
    ("already_quantized", 9, "is already quantized"),
])
def test_checks_that_need_no_weights_come_before_loading_them(case, code, words, tmp_path, capsys):
    src = _unloadable_checkpoint(tmp_path / "src", tokenizer=case != "no_tokenizer", quantized=case == "already_quantized")
    args = ["quantize", "--model", src, "--out", tmp_path / "q", "--nsamples", 2, "--seqlen", 64, "--device", "cpu"]
    if case == "missing_calib":
        args += ["--calib", tmp_path / "missing.jsonl"]
    got, _, err = run_cli(args, capsys)
    assert got == code and err.count("\n") == 1 and words in err, err
    assert not (tmp_path / "q").exists()


@pytest.mark.parametrize("where", ["same", "inside", "holding"])
def test_out_never_overlaps_the_source_checkpoint(where, tmp_path, capsys):
    outer = tmp_path / "outer"
    src = write_random_checkpoint(outer / "src", small_config())
    (outer / "config.json").write_text("{}")             # so --overwrite would take `outer` for a checkpoint
    out = {"same": src, "inside": src / "q", "holding": outer}[where]
    before = {p: p.read_bytes() for p in src.iterdir()}
    code, _, err = run_cli(["quantize", "--model", src, "--out", out, "--overwrite", "--method", "rtn",
                            "--device", "cpu"], capsys)
    assert code == 10 and err.count("\n") == 1, err
    assert {"same": "is", "inside": "is inside", "holding": "holds"}[where] + " the source checkpoint" in err
    assert {p: p.read_bytes() for p in src.iterdir()} == before


def test_a_killed_writes_temp_dir_goes_with_the_next_write_and_a_live_ones_stays(tmp_path):
    """SIGKILL runs no cleanup: the next write to the same out removes the temp dir whose pid is gone."""
    out = tmp_path / "ckpt"
    killed = ("import os, signal, sys\n"
              f"sys.path.insert(0, {str(TESTS)!r})\n"
              "from pathlib import Path\n"
              "import salactl.runtime.checkpoint_write as ckpt\n"
              "from test_hygiene_checkpoint_swap import _save\n"
              "def killed_mid_write(*args, **kwargs):\n"
              "    os.kill(os.getpid(), signal.SIGKILL)\n"
              "ckpt.save_file = killed_mid_write\n"
              f"_save(Path({str(out)!r}), 'new')\n")
    p = subprocess.run([sys.executable, "-c", killed], capture_output=True, text=True, timeout=120)
    assert p.returncode == -signal.SIGKILL, p.stderr
    left = [d.name for d in tmp_path.iterdir()]
    assert len(left) == 1 and left[0].startswith(".ckpt.tmp-") and left[0].split("-")[1].isdigit(), left
    live = tmp_path / f".ckpt.tmp-{os.getpid()}-k3x9q2_a"       # another write, still running
    live.mkdir()
    (tmp_path / ".ckpt.tmp-keep").mkdir()                         # not a name mkdtemp makes
    from test_hygiene_checkpoint_swap import _save

    _save(out, "new")
    assert sorted(d.name for d in tmp_path.iterdir()) == sorted([".ckpt.tmp-keep", live.name, "ckpt"])
    assert json.loads((out / "config.json").read_text())["version"] == "new"

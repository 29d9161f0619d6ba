"""NaN/Inf logits, extreme temperatures and overflowing perplexities end in a clear outcome."""

import json
import math
import shutil
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file, save_file

from salactl.errors import NumericsError, UsageError
from salactl.evaluation.perplexity import perplexity
from salactl.runtime.loader import EMBEDDED_DIR, load_model
from salactl.runtime.sampling import SamplingParams, greedy, sample


def salactl(*args):
    return subprocess.run([sys.executable, "-m", "salactl", *args], capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("t", [float("nan"), float("inf"), -0.5])
def test_non_finite_or_negative_temperature_is_a_usage_error(t):
    with pytest.raises(UsageError, match="finite number >= 0"):
        SamplingParams(temperature=t)


def test_a_tiny_temperature_samples_the_argmax():
    logits = torch.randn(500, generator=torch.Generator().manual_seed(1)) * 30
    g = torch.Generator().manual_seed(0)
    assert sample(logits, SamplingParams(temperature=1e-38), g) == int(logits.argmax())


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_non_finite_logits_are_an_error_greedy_and_sampled(bad):
    logits = torch.randn(3, 50)
    assert greedy(logits) == logits.argmax(-1).tolist()
    logits[1, 7] = bad
    with pytest.raises(NumericsError, match="NaN/Inf logits"):
        greedy(logits)
    with pytest.raises(NumericsError):
        sample(logits[1], SamplingParams(temperature=0.7), torch.Generator().manual_seed(0))


def _scaled_copy(tmp_path, factor):
    out = tmp_path / "model"
    shutil.copytree(EMBEDDED_DIR, out)
    shard = out / json.loads((out / "model.safetensors.index.json").read_text())["weight_map"]["lm_head.weight"]
    sd = load_file(shard)
    sd["lm_head.weight"] = sd["lm_head.weight"] * factor
    save_file(sd, shard, metadata={"format": "pt"})
    return out


def test_nan_weights_stop_run_and_eval_with_one_line(tmp_path):
    model = _scaled_copy(tmp_path, float("nan"))
    for args in (("run", "--model", str(model), "-p", "def f(x):", "-n", "4"),
                 ("eval", "ppl", "--model", str(model), "--max-tokens", "40", "--seq-len", "40")):
        r = salactl(*args)
        assert r.returncode == NumericsError.exit_code, r.stderr
        assert r.stderr.strip().splitlines() == [r.stderr.strip()] and "NaN/Inf logits" in r.stderr


def test_nan_weights_stop_bench_and_sweep_with_the_runtimes_error_not_the_endpoints(tmp_path):
    """The embedded target's NumericsError keeps exit 15 through bench's warmup (it used to become
    exit 8, "endpoint"), and nothing is left in --out."""
    model = str(_scaled_copy(tmp_path, float("nan")))
    for cmd, args in (("bench", ("--scale", "0.002", "--num-requests", "2")),
                      ("sweep", ("--dense-len", "64", "--input-len", "128", "--output-len", "2", "--requests", "1",
                                 "--passkey-lengths", "128", "--passkey-depths", "0.5", "--passkey-trials", "1"))):
        r = salactl(cmd, "--model", model, "--device", "cpu", "--out", str(tmp_path / cmd), "--json", *args)
        assert r.returncode == NumericsError.exit_code, r.stderr
        last = r.stderr.strip().splitlines()[-1]
        assert last.startswith("error: the warmup request of phase") and "NaN/Inf logits" in last, r.stderr
        assert r.stdout == "" and not (tmp_path / cmd).exists()


def test_a_huge_perplexity_is_inf_not_an_overflow(tmp_path):
    lm = load_model(str(_scaled_copy(tmp_path, 3000.0)), "cpu", "float32")
    res = perplexity(lm.model, list(range(3, 60)), 32, None)
    assert math.isfinite(res["nll"]) and res["nll"] > 700 and res["ppl"] == math.inf


def test_empty_prompt_ids_and_empty_eval_file_are_one_line_errors(tmp_path):
    r = salactl("run", "--prompt-ids", "", "-n", "2")
    assert r.returncode == 2 and r.stderr.strip() == "error: --prompt-ids is empty"
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    r = salactl("eval", "ppl", "--file", str(empty))
    assert r.returncode == 7 and len(r.stderr.strip().splitlines()) == 1, r.stderr


def test_run_reports_the_cache_dtype_and_device_that_ran(tmp_path):
    r = salactl("run", "-p", "hi", "-n", "2", "--device", "cpu", "--json", "--out", str(tmp_path))   # fp32 on CPU
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["dtype"] == "float32" and d["kv_cache_dtype"] == "float32"
    assert d["peaks"]["compute_rate"] in ("bf16", "fp32") and d["peaks"]["compute_tflops"] > 0
    knobs = json.loads((tmp_path / "records.jsonl").read_text().splitlines()[0])["knobs"]
    assert knobs["device"] == "cpu" and knobs["kv_cache_dtype"] == "float32"
    assert d["weights"] == knobs["weights"] == "float32"

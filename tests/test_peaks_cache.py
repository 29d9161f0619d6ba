"""The measured-peaks cache ($SALACTL_CACHE_DIR/peaks.json): invalid entries fall back to the
defaults instead of breaking the roofline, and a cache directory that cannot be made is a usage
error before `salactl info --measure` measures anything."""

import json
import os
import subprocess
import sys

import pytest
import torch

from salactl.errors import UsageError
from salactl.runtime.peaks import device_name, load_measured, peaks_for

CPU = torch.device("cpu")


def salactl(*args, cache):
    env = {**os.environ, "SALACTL_CACHE_DIR": str(cache)}
    return subprocess.run([sys.executable, "-m", "salactl", *args], capture_output=True, text=True,
                          timeout=300, env=env)


BAD = [{"mem_gbps": 0, "bf16_tflops": -1}, {"mem_gbps": "fast", "bf16_tflops": None},
       {"mem_gbps": True, "bf16_tflops": 1.0}, {"mem_gbps": float("inf"), "bf16_tflops": 1.0},
       {"mem_gbps": 10.0}, 5]


@pytest.mark.parametrize("entry", BAD, ids=range(len(BAD)))
def test_invalid_entries_fall_back_to_the_defaults(tmp_path, monkeypatch, entry):
    monkeypatch.setenv("SALACTL_CACHE_DIR", str(tmp_path))
    good = {"mem_gbps": 30.0, "bf16_tflops": 0.5}
    (tmp_path / "peaks.json").write_text(json.dumps({device_name(CPU): entry, "other": good}))
    assert load_measured() == {"other": good}
    assert peaks_for(CPU).source == "cpu-default"


@pytest.mark.parametrize("text", ["{not json", "[1, 2]", "\udcff"])
def test_unreadable_cache_is_ignored(tmp_path, monkeypatch, text):
    monkeypatch.setenv("SALACTL_CACHE_DIR", str(tmp_path))
    (tmp_path / "peaks.json").write_bytes(text.encode("utf-8", "surrogateescape"))
    assert load_measured() == {} and peaks_for(CPU).source == "cpu-default"


def test_run_with_an_invalid_cache_entry_uses_the_defaults(tmp_path):
    (tmp_path / "peaks.json").write_text(json.dumps({device_name(CPU): {"mem_gbps": 0, "bf16_tflops": -1}}))
    p = salactl("run", "--prompt-ids", "1,2,3", "-n", "2", "--device", "cpu", "--json", cache=tmp_path)
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["peaks"]["source"] == "cpu-default"


def test_run_uses_a_valid_cache_entry(tmp_path):
    (tmp_path / "peaks.json").write_text(json.dumps({device_name(CPU): {"mem_gbps": 30.0, "bf16_tflops": 0.5}}))
    p = salactl("run", "--prompt-ids", "1,2,3", "-n", "2", "--device", "cpu", "--json", cache=tmp_path)
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["peaks"] == {"device": device_name(CPU), "mem_gbps": 30.0, "bf16_tflops": 0.5,
                                             "source": "measured", "fp32_tflops": None,
                                             "compute_tflops": 0.5, "compute_rate": "bf16"}


def test_measure_with_the_cache_below_a_file_is_a_usage_error(tmp_path):
    (tmp_path / "f").write_text("keep")
    p = salactl("info", "--measure", "--device", "cpu", cache=tmp_path / "f" / "cache")
    assert p.returncode == UsageError.exit_code, p.stderr
    assert "Traceback" not in p.stderr and p.stderr.strip().splitlines()[-1].startswith("error: cannot write")
    assert "SALACTL_CACHE_DIR" in p.stderr and (tmp_path / "f").read_text() == "keep"


def test_a_float32_run_uses_the_measured_fp32_matmul_rate(tmp_path):
    entry = {"mem_gbps": 30.0, "bf16_tflops": 0.5, "fp32_tflops": 0.125}
    (tmp_path / "peaks.json").write_text(json.dumps({device_name(CPU): entry}))
    p = salactl("run", "--prompt-ids", "1,2,3", "-n", "2", "--device", "cpu", "--dtype", "float32", "--json",
                cache=tmp_path)
    assert p.returncode == 0, p.stderr
    d = json.loads(p.stdout)
    assert (d["peaks"]["compute_tflops"], d["peaks"]["compute_rate"]) == (0.125, "fp32")
    row = d["roofline"]["prefill"][-1]
    assert row["floor_s"] == pytest.approx(max(row["bytes"] / 30e9, row["flops"] / 0.125e12), rel=1e-6)

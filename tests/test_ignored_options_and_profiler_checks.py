"""Options that would be ignored are refused (exit 2): `quantize --method rtn --seed` with nothing
seeded, `sweep --no-kl --pareto-x`; and a profiler that cannot run here (`profile --ncu` without a
GPU, `--nvml` without NVML) is exit 6 before the memory checks (exit 11) give advice for it."""

import json
import os
import subprocess
import sys

import pytest

# a profile far past any machine's memory: without the profiler check first, exit 11
HUGE_PROFILE = ("--phase", "decode", "--batch", "1024", "--context", "10000000")
SPEED = ("--device", "cpu", "--input-len", "8", "--output-len", "2", "--requests", "1")


def salactl(*args, **env):
    return subprocess.run([sys.executable, "-m", "salactl", *map(str, args)], capture_output=True, text=True,
                          timeout=300, env=dict(os.environ, PYTHONUNBUFFERED="1", **env))


def refused(r, code: int, *words: str) -> None:
    assert r.returncode == code, r.stderr
    line = r.stderr.strip()
    assert line.startswith("error: ") and "\n" not in line, line
    for w in words:
        assert w in line, line


def test_rtn_without_calibration_refuses_a_seed_nothing_uses(tmp_path):
    r = salactl("quantize", "--method", "rtn", "--seed", "4", "--out", tmp_path / "q")
    refused(r, 2, "--seed applies to --random-weights and the calibration windows", "drop it")
    assert not (tmp_path / "q").exists()


@pytest.mark.parametrize("args", [
    ("--random-weights", "--seed", "4"),                                  # draws the weights
    ("--calib", "random", "--nsamples", "2", "--seqlen", "16", "--seed", "4"),      # draws the ids
    ("--kv-cache-dtype", "fp8_e4m3", "--nsamples", "2", "--seqlen", "16", "--seed", "4"),  # picks the windows
    ("--dtype", "bf16"),            # what the weights load in: the memory the load takes
])
def test_rtn_accepts_seed_and_dtype_where_they_are_used(tmp_path, args):
    r = salactl("quantize", "--method", "rtn", *args, "--out", tmp_path / "q", "--json")
    assert r.returncode == 0, r.stderr
    record = json.loads(r.stdout)
    if "--random-weights" in args:
        assert record["model"].endswith(":seed=4")
    assert (tmp_path / "q" / "config.json").is_file()


@pytest.mark.parametrize("args, env", [
    (("--ncu", "--device", "cpu"), {}),
    (("--ncu",), {"CUDA_VISIBLE_DEVICES": ""}),
])
def test_ncu_without_a_gpu_is_a_device_error_before_the_memory_check(tmp_path, args, env):
    r = salactl("profile", *args, *HUGE_PROFILE, "--out", tmp_path / "p", **env)
    refused(r, 6, "--ncu needs a CUDA GPU")
    assert not (tmp_path / "p").exists()


def _nvml_usable() -> bool:
    try:
        import pynvml

        pynvml.nvmlInit()
        return True
    except Exception:
        return False


@pytest.mark.skipif(_nvml_usable(), reason="NVML works here")
def test_nvml_without_nvml_is_a_device_error_before_the_memory_check(tmp_path):
    r = salactl("profile", "--nvml", "--device", "cpu", *HUGE_PROFILE, "--out", tmp_path / "p")
    refused(r, 6, "NVML is not usable here")
    assert not (tmp_path / "p").exists()


def test_sweep_refuses_pareto_x_with_no_kl(tmp_path):
    r = salactl("sweep", *SPEED, "--no-kl", "--no-passkey", "--pareto-x", "ttft", "--out", tmp_path / "o")
    assert r.returncode == 2, r.stderr
    assert r.stderr.strip() == ("error: --pareto-x applies to the Pareto front, which trades latency against the "
                                "logit KL that --no-kl skips; drop it, or drop --no-kl")
    assert not (tmp_path / "o").exists()


def test_sweep_pareto_x_defaults_to_e2e_and_is_taken_with_the_kl(tmp_path):
    r = salactl("sweep", *SPEED, "--no-kl", "--no-passkey", "--out", tmp_path / "a", "--json")
    assert r.returncode == 0, r.stderr
    assert "no Pareto front: it trades e2e against the logit KL" in r.stderr
    r = salactl("sweep", *SPEED, "--no-passkey", "--pareto-x", "ttft", "--out", tmp_path / "b", "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["pareto"]

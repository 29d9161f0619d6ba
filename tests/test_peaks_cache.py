"""The measured-peaks cache ($SALACTL_CACHE_DIR/peaks.json): invalid entries fall back to the
defaults (with a warning) instead of breaking the roofline, entries are keyed by CPU model, a cache
that cannot be written is a usage error before `salactl info --measure` measures anything, and the
measurement keeps the fastest repetition on buffers larger than the last-level cache."""

import json
import os
import platform
import subprocess
import sys

import pytest
import torch

from salactl.env import environment
from salactl.errors import UsageError
from salactl.runtime.peaks import cache_path, cpu_model, device_name, load_measured, peaks_for
from salactl.runtime.peaks_measure import (cpu_copy_buffer_bytes, fastest_rep, last_level_cache_bytes,
                                           parse_cache_size, store_measurement)

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


def test_the_fastest_rep_is_the_ceiling_and_a_slow_median_is_noise():
    assert fastest_rep([0.30, 0.10, 0.20]) == (0.10, True)        # median 2x the fastest
    assert fastest_rep([0.12, 0.10, 0.11, 0.125]) == (0.10, False)


def test_cpu_copy_buffers_outsize_the_last_level_cache(tmp_path):
    l3 = 480 << 20
    assert cpu_copy_buffer_bytes(l3, None) >= 4 * l3
    assert cpu_copy_buffer_bytes(2 << 20, None) == 256 << 20
    assert cpu_copy_buffer_bytes(None, None) == 512 << 20
    assert 2 * cpu_copy_buffer_bytes(l3, 4 << 30) <= 1 << 30        # both buffers within 1/4 of MemAvailable
    for index, (level, size) in enumerate([(1, "48K"), (2, "2048K"), (3, "491520K")]):
        (tmp_path / f"index{index}").mkdir()
        (tmp_path / f"index{index}" / "level").write_text(f"{level}\n")
        (tmp_path / f"index{index}" / "size").write_text(f"{size}\n")
    assert last_level_cache_bytes(tmp_path) == 491520 << 10
    assert last_level_cache_bytes(tmp_path / "none") is None
    assert [parse_cache_size(t) for t in ("32M", "1G", "512")] == [32 << 20, 1 << 30, 512]


def test_the_cpu_key_names_the_model_and_the_usable_cpus(tmp_path, monkeypatch):
    cpuinfo = open("/proc/cpuinfo").read() if os.path.exists("/proc/cpuinfo") else ""
    models = [line.split(":", 1)[1].strip() for line in cpuinfo.splitlines() if line.startswith("model name")]
    if models:
        assert cpu_model() == models[0]
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    assert device_name(CPU) == f"cpu:{cpu_model()}:{usable}cpus:{torch.get_num_threads()}t"
    env = environment()
    assert (env["cpu"], env["cpu_count"]) == (cpu_model(), usable)
    # an entry under the old key (any x86_64 machine with as many threads) is not this machine's
    monkeypatch.setenv("SALACTL_CACHE_DIR", str(tmp_path))
    old_key = f"cpu:{platform.machine()}:{torch.get_num_threads()}t"
    (tmp_path / "peaks.json").write_text(json.dumps({old_key: {"mem_gbps": 200.0, "bf16_tflops": 5.0}}))
    assert peaks_for(CPU).source == "cpu-default"


def test_the_cache_dir_is_expanded_and_absolute(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("SALACTL_CACHE_DIR", "~/salactl")
    assert cache_path() == tmp_path.resolve() / "salactl" / "peaks.json"
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("SALACTL_CACHE_DIR", "rel")
    assert cache_path() == tmp_path.resolve() / "rel" / "peaks.json"


def unwritable_caches(tmp_path):
    (tmp_path / "peaks.json").mkdir()
    yield tmp_path, "is a directory"
    if os.path.isdir("/proc/self"):                                   # procfs refuses new directories
        yield "/proc/salactl-cache", "cannot create /proc/salactl-cache"


def test_measure_refuses_an_unwritable_cache_before_measuring(tmp_path):
    for cache, said in unwritable_caches(tmp_path):
        p = salactl("info", "--measure", "--device", "cpu", cache=cache)
        assert p.returncode == UsageError.exit_code, p.stderr
        assert "measuring" not in p.stderr and "Traceback" not in p.stderr
        line, = p.stderr.strip().splitlines()
        assert line.startswith("error: cannot write the peaks cache") and "peaks.json" in line and said in line


def test_a_failed_cache_write_is_a_usage_error_naming_the_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SALACTL_CACHE_DIR", str(tmp_path))
    path = tmp_path / "peaks.json"
    path.mkdir()                                                      # made after the check, as by another process
    with pytest.raises(UsageError, match=f"cannot write the peaks cache {path}: ") as e:
        store_measurement(device_name(CPU), {"mem_gbps": 30.0, "bf16_tflops": 0.5})
    assert ".tmp" not in str(e.value) and os.listdir(path) == [] and os.listdir(tmp_path) == ["peaks.json"]


def test_the_cpu_default_has_an_fp32_rate(tmp_path):
    p = salactl("run", "--prompt-ids", "1,2,3", "-n", "2", "--device", "cpu", "--dtype", "float32", cache=tmp_path)
    assert p.returncode == 0, p.stderr
    assert "0.2 TFLOP/s (fp32 matmul; cpu-default)" in p.stdout


CORRUPT = {"truncated": '{\n  "cpu:x": {\n    "mem_gbps": 27.5,\n', "list": "[1, 2]", "empty": "",
           "wrong schema": json.dumps({"cpu:x": {"mem_gbps": 10, "bf16_tflops": 1, "fp32_tflops": 0}})}


@pytest.mark.parametrize("text", CORRUPT.values(), ids=CORRUPT.keys())
def test_a_corrupt_cache_warns_once(tmp_path, monkeypatch, capsys, text):
    monkeypatch.setenv("SALACTL_CACHE_DIR", str(tmp_path))
    (tmp_path / "peaks.json").write_text(text)
    assert peaks_for(CPU).source == "cpu-default" and load_measured() == {}
    warning, = capsys.readouterr().err.strip().splitlines()
    assert warning.startswith("warning: ignoring ") and str(tmp_path / "peaks.json") in warning
    assert warning.endswith("`salactl info --measure` rewrites it")


def test_a_cache_that_cannot_be_read_says_why_without_advising_measure(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("SALACTL_CACHE_DIR", str(tmp_path))
    (tmp_path / "peaks.json").mkdir()          # --measure refuses this one too, so it is not the fix
    assert peaks_for(CPU).source == "cpu-default" and load_measured() == {}
    warning, = capsys.readouterr().err.strip().splitlines()
    assert warning.startswith(f"warning: cannot read the peaks cache {tmp_path / 'peaks.json'} (")
    assert "--measure" not in warning


def test_a_missing_cache_does_not_warn(tmp_path):
    p = salactl("info", "--json", cache=tmp_path)
    assert p.returncode == 0 and p.stderr == "", p.stderr
    assert json.loads(p.stdout)["peaks"]["source"] == "cpu-default"

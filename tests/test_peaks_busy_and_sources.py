"""Roofline ceilings say where they came from: the H200 NVL's own datasheet row, a GPU missing from
the datasheet labelled as NVML bandwidth with a default compute rate, and `info --measure` on a busy
machine neither replacing an idle measurement nor passing its low numbers off as plain "measured"."""

import json
import os
import subprocess
import sys
import types

import pytest
import torch

from salactl.output import ceilings
from salactl.runtime.peaks import Peaks, device_name, load_measured, peaks_by_name, peaks_for
from salactl.runtime.peaks_measure import BUSY_WARNING, record_measurement, store_measurement

CPU = torch.device("cpu")
IDLE = {"mem_gbps": 30.0, "bf16_tflops": 0.5, "fp32_tflops": 0.2, "busy": False}


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SALACTL_CACHE_DIR", str(tmp_path))
    return tmp_path / "peaks.json"


def warnings(capsys) -> list[str]:
    return capsys.readouterr().err.strip().splitlines()


def test_the_h200_nvl_has_its_own_datasheet_row(cache):
    nvl = peaks_by_name("NVIDIA H200 NVL", "cuda")
    assert (nvl.mem_gbps, nvl.bf16_tflops, nvl.fp32_tflops, nvl.source) == (4800.0, 835.0, 60.0, "datasheet")
    sxm = peaks_by_name("NVIDIA H200", "cuda")
    assert (sxm.mem_gbps, sxm.bf16_tflops, sxm.fp32_tflops) == (4800.0, 989.0, 67.0)


def fake_nvml(bus_width_bits: int, mem_clock_mhz: int) -> types.ModuleType:
    """pynvml (third-party; without a GPU driver it cannot answer) as a GPU's driver would."""
    nvml = types.ModuleType("pynvml")
    nvml.NVML_CLOCK_MEM = 2
    nvml.nvmlInit = lambda: None
    nvml.nvmlDeviceGetHandleByIndex = lambda index: index
    nvml.nvmlDeviceGetMemoryBusWidth = lambda handle: bus_width_bits
    nvml.nvmlDeviceGetMaxClockInfo = lambda handle, clock: mem_clock_mhz
    return nvml


def test_a_gpu_missing_from_the_datasheet_says_its_compute_rate_is_a_default(cache, monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml(5120, 2619))
    p = peaks_by_name("NVIDIA Future GPU", "cuda", 0)
    assert p.mem_gbps == pytest.approx(2 * 2619e6 * 5120 / 8 / 1e9) and p.bf16_tflops == 100.0
    assert p.source == "nvml bandwidth, default compute"
    record = p.for_dtype(torch.bfloat16)                    # what run/profile --json store and print
    assert record["source"] == "nvml bandwidth, default compute"
    assert ceilings(record).endswith("(bf16 matmul; nvml bandwidth, default compute)")
    monkeypatch.setitem(sys.modules, "pynvml", None)         # no NVML: nothing measured at all
    assert peaks_by_name("NVIDIA Future GPU", "cuda", 0).source == "unknown-gpu-default"


@pytest.mark.parametrize("idle", [IDLE, {"mem_gbps": 30.0, "bf16_tflops": 0.5}], ids=["idle", "before-busy"])
def test_a_busy_entry_does_not_replace_an_idle_one(cache, idle):
    name = device_name(CPU)
    cache.write_text(json.dumps({name: idle}))
    busy = {"mem_gbps": 3.0, "bf16_tflops": 0.05, "busy": True}
    assert store_measurement(name, busy) == idle
    assert load_measured()[name] == idle
    assert store_measurement(name, {**busy, "busy": False}) == {**busy, "busy": False}   # an idle one does


@pytest.mark.parametrize("when", ["2025-01-02T03:04:05", None])
def test_a_busy_measurement_keeps_the_idle_one_and_says_so(cache, capsys, when):
    name = device_name(CPU)
    idle = {**IDLE, "measured_at": when} if when else IDLE
    cache.write_text(json.dumps({name: idle}))
    before = cache.read_text()
    m = record_measurement(name, 3.0, 0.05, 0.02, busy=True)
    assert cache.read_text() == before
    assert (m.busy, m.stored, m.measured_at) == (True, False, when)
    assert m.peaks == peaks_for(CPU) == Peaks(name, 30.0, 0.5, "measured", 0.2)
    warning, = warnings(capsys)
    assert f"kept the idle measurement of {when or 'an unknown time'}" in warning
    assert warning.endswith("re-run --measure when the machine is idle to replace it")


def test_a_busy_measurement_without_an_idle_one_is_stored_as_busy(cache, capsys):
    name = device_name(CPU)
    m = record_measurement(name, 3.0, 0.05, 0.02, busy=True)
    assert (m.busy, m.stored) == (True, True) and load_measured()[name]["busy"] is True
    assert m.peaks == peaks_for(CPU) and m.peaks.source == "measured while busy"
    assert ceilings(peaks_for(CPU).for_dtype(torch.bfloat16)).endswith("(bf16 matmul; measured while busy)")
    assert warnings(capsys) == [f"warning: {BUSY_WARNING}"]
    later = record_measurement(name, 3.5, 0.06, 0.03, busy=True)         # a newer busy one replaces it
    assert later.stored and peaks_for(CPU).mem_gbps == 3.5
    idle = record_measurement(name, 30.0, 0.5, 0.2, busy=False)
    assert idle.stored and peaks_for(CPU) == Peaks(name, 30.0, 0.5, "measured", 0.2)
    assert load_measured()[name]["busy"] is False


@pytest.mark.parametrize("flag", ["yes", 1, 0, None])
def test_a_busy_flag_that_is_not_true_or_false_is_an_invalid_entry(cache, capsys, flag):
    cache.write_text(json.dumps({device_name(CPU): {**IDLE, "busy": flag}}))
    assert load_measured() == {} and peaks_for(CPU).source == "cpu-default"
    warning, = warnings(capsys)
    assert warning.startswith("warning: ignoring 1 entry of the peaks cache") and "busy" in warning


def test_info_measure_shows_the_ceilings_left_in_effect(tmp_path):
    """Busy or not (this machine decides), what `info --measure --json` shows is what later runs use."""
    name = device_name(CPU)
    seed = {**IDLE, "measured_at": "2025-01-02T03:04:05"}
    (tmp_path / "peaks.json").write_text(json.dumps({name: seed}))
    p = subprocess.run([sys.executable, "-m", "salactl", "info", "--measure", "--json", "--device", "cpu"],
                       capture_output=True, text=True, timeout=300,
                       env={**os.environ, "SALACTL_CACHE_DIR": str(tmp_path)})
    assert p.returncode == 0, p.stderr
    d = json.loads(p.stdout)
    cached = json.loads((tmp_path / "peaks.json").read_text())[name]
    assert d["peaks"]["source"] == "measured"                 # the idle seed, or an idle measurement
    assert (d["peaks"]["mem_gbps"], d["peaks"]["bf16_tflops"]) == (cached["mem_gbps"], cached["bf16_tflops"])
    assert d["measurement"]["measured_at"] == cached["measured_at"]
    if d["measurement"]["busy"]:
        assert not d["measurement"]["stored"] and cached == seed
        assert "kept the idle measurement of 2025-01-02T03:04:05" in p.stderr
    else:
        assert d["measurement"]["stored"] and cached["busy"] is False

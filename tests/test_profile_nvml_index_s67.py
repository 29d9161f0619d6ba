"""`profile --nvml` samples the GPU the step runs on: NVML numbers every GPU of the machine, CUDA
only those CUDA_VISIBLE_DEVICES shows, so --device cuda:1 (or cuda:0 under CUDA_VISIBLE_DEVICES=3)
is not NVML's GPU 1 (or 0), whose memory, power and clocks another job's work would fill."""

import sys
import types

import pytest
import torch

from salactl.errors import DeviceError
from salactl.profiling.nvml_sampler import NvmlSampler, nvml_index


def fake_nvml(opened: list) -> types.ModuleType:
    """pynvml (third-party; without a GPU driver it cannot answer) noting the GPUs opened."""
    nvml = types.ModuleType("pynvml")
    nvml.nvmlInit = lambda: None
    nvml.nvmlDeviceGetHandleByIndex = lambda index: opened.append(index) or index
    return nvml


@pytest.mark.parametrize("visible, device, index", [
    (None, "cuda:1", 1),
    ("3", "cuda:0", 3),
    ("3", "cuda", 3),
    ("2,5", "cuda:1", 5),
    ("2,5", "cpu", 0),             # a CPU step: NVML's first GPU, as before
])
def test_nvml_samples_the_profiled_gpu(monkeypatch, visible, device, index):
    if visible is None:
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    else:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    opened = []
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml(opened))
    NvmlSampler(index=nvml_index(torch.device(device)))
    assert opened == [index]


def test_a_gpu_nvml_cannot_number_is_a_device_error(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    with pytest.raises(DeviceError, match=r"^cannot tell which GPU NVML numbers cuda:1 \(device 1 is not visible"):
        nvml_index(torch.device("cuda:1"))


@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.device_count() < 2, reason="needs 2 CUDA GPUs")
def test_nvml_memory_is_the_visible_gpus(tmp_path):
    """Under CUDA_VISIBLE_DEVICES=1 the step runs on the second GPU: the memory NVML saw in use there
    holds at least the step's own peak (the first GPU, idle, holds none of it)."""
    import json
    import os
    import subprocess

    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "1"}
    p = subprocess.run([sys.executable, "-m", "salactl", "profile", "--nvml", "--torch", "--backend", "reference",
                        "--context", "64", "--warmup", "0", "--out", str(tmp_path / "p"), "--json"],
                       capture_output=True, text=True, timeout=600, env=env)
    assert p.returncode == 0, p.stderr
    r = json.loads(p.stdout)
    assert r["nvml"]["mem_used_bytes"]["max"] >= r["manifest"]["peak_memory_bytes"] > 0


def test_run_roofline_bandwidth_reads_the_gpu_it_runs_on(monkeypatch, tmp_path):
    """A GPU missing from the datasheet takes NVML's bandwidth: that of the GPU the run uses (NVML's
    GPU 5 for cuda:1 under CUDA_VISIBLE_DEVICES=2,5), not NVML's GPU 1."""
    from salactl.runtime import peaks

    monkeypatch.setenv("SALACTL_CACHE_DIR", str(tmp_path))          # no measured ceilings cached
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,5")
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "Some Future GPU")
    opened = []
    nvml = fake_nvml(opened)
    nvml.NVML_CLOCK_MEM = 2
    nvml.nvmlDeviceGetMemoryBusWidth = lambda h: 5120
    nvml.nvmlDeviceGetMaxClockInfo = lambda h, kind: 2619
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    p = peaks.peaks_for(torch.device("cuda:1"))
    assert opened == [5] and p.source == "nvml bandwidth, default compute"
    assert p.mem_gbps == pytest.approx(2 * 2619e6 * 5120 / 8 / 1e9)

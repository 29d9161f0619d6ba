"""Device ceilings for the roofline: a datasheet table of known GPUs, NVML (bus width × memory
clock), and measured ceilings (`salactl info --measure`) cached per device."""

from __future__ import annotations

import json
import math
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from salactl.reports.atomic import write_atomic

# name fragment -> (memory GB/s, dense bf16 TFLOP/s); vendor datasheets (dense, no sparsity).
DATASHEET = {
    "H200": (4800.0, 989.0),
    "H100 SXM": (3350.0, 989.0),
    "H100 80GB HBM3": (3350.0, 989.0),
    "H100 PCIe": (2000.0, 756.0),
    "H100": (3350.0, 989.0),
    "A100-SXM4-80GB": (2039.0, 312.0),
    "A100 80GB PCIe": (1935.0, 312.0),
    "A100": (1555.0, 312.0),
    "RTX PRO 6000D": (1398.0, 148.0),
    "RTX PRO 6000": (1792.0, 503.8),
    "RTX 5090": (1792.0, 209.5),
    "L40S": (864.0, 362.0),
}


@dataclass(frozen=True)
class Peaks:
    device: str
    mem_gbps: float
    bf16_tflops: float
    source: str          # "measured", "datasheet", "nvml", "cpu-default"
    fp32_tflops: float | None = None     # measured only (no datasheet column)

    def matmul_tflops(self, dtype: torch.dtype) -> tuple[float, str]:
        """The compute ceiling for GEMMs in `dtype`, and which rate it is: a float32 model's
        floor uses the float32 rate where it was measured (on a CPU it can be a third of bf16's)."""
        if dtype == torch.float32 and self.fp32_tflops:
            return self.fp32_tflops, "fp32"
        return self.bf16_tflops, "bf16"

    def to_dict(self) -> dict:
        return asdict(self)

    def for_dtype(self, dtype: torch.dtype) -> dict:
        """to_dict() plus the ceiling a `dtype` model's FLOP floors use: compute_tflops, compute_rate."""
        tflops, rate = self.matmul_tflops(dtype)
        return {**self.to_dict(), "compute_tflops": tflops, "compute_rate": rate}


def cache_path() -> Path:
    root = Path(os.environ.get("SALACTL_CACHE_DIR") or Path.home() / ".cache" / "salactl")
    return root / "peaks.json"


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    import platform

    return f"cpu:{platform.processor() or platform.machine()}:{torch.get_num_threads()}t"


def datasheet(name: str) -> tuple[float, float] | None:
    for frag in sorted(DATASHEET, key=len, reverse=True):
        if frag.lower() in name.lower():
            return DATASHEET[frag]
    return None


def nvml_bandwidth_gbps(index: int = 0) -> float | None:
    try:
        import pynvml

        pynvml.nvmlInit()
        h = pynvml.nvmlDeviceGetHandleByIndex(index)
        width = pynvml.nvmlDeviceGetMemoryBusWidth(h)
        clock = pynvml.nvmlDeviceGetMaxClockInfo(h, pynvml.NVML_CLOCK_MEM)
        return 2 * clock * 1e6 * width / 8 / 1e9
    except Exception:
        return None


def load_measured() -> dict:
    """The cached measurements by device name; an unreadable cache or an entry without two
    positive finite ceilings (a hand-edited or truncated file) is left out: defaults apply."""
    try:
        data = json.loads(cache_path().read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict):
        return {}
    return {name: entry for name, entry in data.items() if _valid(entry)}


def _valid(entry) -> bool:
    def positive(v):
        return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v > 0

    return (isinstance(entry, dict) and positive(entry.get("mem_gbps")) and positive(entry.get("bf16_tflops"))
            and (entry.get("fp32_tflops") is None or positive(entry["fp32_tflops"])))


def check_cache_dir() -> Path:
    """The cache file's path, or a usage error before measuring when its directory cannot be made."""
    from salactl.errors import UsageError

    path = cache_path()
    existing = next(p for p in path.absolute().parents if p.exists())
    if not existing.is_dir():
        raise UsageError(f"cannot write the peaks cache {path}: {existing} is a file; "
                         "set SALACTL_CACHE_DIR to a directory")
    return path


def peaks_for(device: torch.device) -> Peaks:
    return peaks_by_name(device_name(device), device.type, device.index or 0)


def peaks_by_name(name: str, device_type: str, nvml_index: int | None = None) -> Peaks:
    """Measured ceilings for `name` if cached, else the datasheet, NVML's bandwidth (when an index
    is given) or a default."""
    measured = load_measured().get(name)
    if measured:
        return Peaks(name, measured["mem_gbps"], measured["bf16_tflops"], "measured", measured.get("fp32_tflops"))
    if device_type == "cuda":
        ds = datasheet(name)
        if ds:
            return Peaks(name, ds[0], ds[1], "datasheet")
        bw = nvml_bandwidth_gbps(nvml_index) if nvml_index is not None else None
        return Peaks(name, bw or 1000.0, 100.0, "nvml" if bw else "unknown-gpu-default")
    # No CPU datasheet: a conservative default until `salactl info --measure` runs.
    return Peaks(name, 20.0, 0.2, "cpu-default")


def _time(fn, device, reps: int) -> float:
    fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        times = []
        for _ in range(reps):
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1e3)
    else:
        times = []
        for _ in range(reps):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
    times.sort()
    return times[len(times) // 2]


def measure(device: torch.device) -> Peaks:
    """Median device-to-device copy bandwidth (read+write bytes) and bf16 and fp32 GEMM rates."""
    path = check_cache_dir()
    gpu = device.type == "cuda"
    n = (1 << 30) if gpu else (64 << 20)                  # bytes per buffer
    src = torch.empty(n // 2, dtype=torch.bfloat16, device=device).normal_()
    dst = torch.empty_like(src)
    copy_s = _time(lambda: dst.copy_(src), device, 20 if gpu else 5)
    mem_gbps = 2 * n / copy_s / 1e9
    m = 8192 if gpu else 1024

    def gemm_tflops(dtype):
        a = torch.randn(m, m, device=device, dtype=dtype)
        b = torch.randn(m, m, device=device, dtype=dtype)
        return 2 * m ** 3 / _time(lambda: a @ b, device, 20 if gpu else 3) / 1e12

    tflops, fp32 = gemm_tflops(torch.bfloat16), gemm_tflops(torch.float32)
    name = device_name(device)
    data = load_measured()
    data[name] = {"mem_gbps": mem_gbps, "bf16_tflops": tflops, "fp32_tflops": fp32,
                  "measured_at": time.strftime("%Y-%m-%dT%H:%M:%S")}
    write_atomic(path, json.dumps(data, indent=2))
    return Peaks(name, mem_gbps, tflops, "measured", fp32)

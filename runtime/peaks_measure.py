"""`salactl info --measure`: the device's copy bandwidth and bf16 / fp32 GEMM rates, each the
fastest of its repetitions, on buffers that outsize the CPU's last-level cache, stored in the peaks
cache that runtime/peaks.py reads."""

from __future__ import annotations

import json
import os
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from salactl.errors import OutputWriteError
from salactl.reports.atomic import DiskFullError, exclusive_lock, write_atomic, write_remedy
from salactl.runtime.loader import available_host_bytes
from salactl.runtime.peaks import (Peaks, cannot_write, cache_path, check_cache_dir, device_name, load_measured,
                                   measured_peaks)


# A ceiling is the best rate the machine reaches: time repetitions for a budget, keep the fastest.
CPU_BUDGET_S = 0.4
CPU_MIN_REPS = 3
GPU_REPS = 20
NOISY_SPREAD = 1.3          # median rep this much slower than the fastest: something else ran
BUSY_WARNING = ("the machine is busy; the ceilings may be low (stored as measured while busy), "
                "re-run --measure when it is idle")


def fastest_rep(times: list[float]) -> tuple[float, bool]:
    """The fastest repetition's time, and whether the reps were noisy (median > 1.3x the fastest)."""
    best = min(times)
    return best, statistics.median(times) > NOISY_SPREAD * best


def _rep_times(fn, device) -> list[float]:
    fn()                                                  # warm-up: page faults, kernel choice
    times = []
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        with torch.cuda.device(device):               # events record on the current device's stream
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            for _ in range(GPU_REPS):
                start.record()
                fn()
                end.record()
                end.synchronize()
                times.append(start.elapsed_time(end) / 1e3)
        return times
    began = time.perf_counter()
    while len(times) < CPU_MIN_REPS or time.perf_counter() - began < CPU_BUDGET_S:
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return times


def parse_cache_size(text: str) -> int:
    """A sysfs cache size ("491520K", "32M", "1024") in bytes."""
    text = text.strip().upper()
    scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
    return int(text[:-1] if scale > 1 else text) * scale


SYSFS_CPU0_CACHE = Path("/sys/devices/system/cpu/cpu0/cache")


def last_level_cache_bytes(cache_dir: Path = SYSFS_CPU0_CACHE) -> int | None:
    """The size of the highest cache level sysfs lists for cpu0, or None where it lists none."""
    by_level: dict[int, int] = {}
    for index in cache_dir.glob("index*"):
        try:
            level = int((index / "level").read_text())
            size = parse_cache_size((index / "size").read_text())
        except (OSError, ValueError):
            continue
        by_level[level] = max(by_level.get(level, 0), size)
    return by_level[max(by_level)] if by_level else None


def cpu_copy_buffer_bytes(llc_bytes: int | None, mem_available: int | None) -> int:
    """Bytes per copy buffer on a CPU: 4x the last-level cache and at least 256 MiB, so the copy
    streams DRAM rather than cache (512 MiB where the cache size is unknown); both buffers take at
    most a quarter of the available memory. Whole MiB."""
    size = max(4 * llc_bytes, 256 << 20) if llc_bytes else 512 << 20
    if mem_available:
        size = min(size, mem_available // 8)
    return max(size >> 20, 1) << 20


def _copy_times(device: torch.device) -> tuple[int, list[float]]:
    if device.type == "cuda":
        n = 1 << 30
    else:
        n = cpu_copy_buffer_bytes(last_level_cache_bytes(), available_host_bytes())
    src = torch.empty(n // 2, dtype=torch.bfloat16, device=device).fill_(1.0)   # touch every page
    dst = torch.empty_like(src)
    return n, _rep_times(lambda: dst.copy_(src), device)


def _gemm_times(device: torch.device, m: int, dtype: torch.dtype) -> list[float]:
    a = torch.randn(m, m, device=device, dtype=dtype)
    b = torch.randn(m, m, device=device, dtype=dtype)
    return _rep_times(lambda: a @ b, device)


@dataclass(frozen=True)
class Measurement:
    """What a measurement leaves in effect: `peaks`, the cached ceilings afterwards; `busy`, whether
    this measurement's machine was busy; `stored`, whether its numbers were cached (a busy one does
    not replace an idle one); `measured_at`, when the ceilings in effect were measured."""
    peaks: Peaks
    busy: bool
    stored: bool
    measured_at: str | None

    def to_dict(self) -> dict:
        return {"busy": self.busy, "stored": self.stored, "measured_at": self.measured_at}


def measure(device: torch.device) -> Peaks:
    """The ceilings in effect after measuring `device` (measure_and_store)."""
    return measure_and_store(device).peaks


def measure_and_store(device: torch.device) -> Measurement:
    """The fastest rep's device-to-device copy bandwidth (read+write bytes) and bf16 and fp32 GEMM
    rates, cached by record_measurement; the machine counts as busy on load or reps of uneven speed."""
    check_cache_dir()
    gpu = device.type == "cuda"
    busy = not gpu and hasattr(os, "getloadavg") and os.getloadavg()[0] >= torch.get_num_threads()
    n, copy_times = _copy_times(device)
    m = 8192 if gpu else 1024
    timed = [(2 * n / 1e9, copy_times),                                 # GB per rep -> GB/s
             (2 * m ** 3 / 1e12, _gemm_times(device, m, torch.bfloat16)),  # TFLOP per rep -> TFLOP/s
             (2 * m ** 3 / 1e12, _gemm_times(device, m, torch.float32))]
    rates = []
    for work, times in timed:
        best, noisy = fastest_rep(times)
        rates.append(work / best)
        busy = busy or noisy
    mem_gbps, tflops, fp32 = rates
    return record_measurement(device_name(device), mem_gbps, tflops, fp32, busy)


def record_measurement(name: str, mem_gbps: float, bf16_tflops: float, fp32_tflops: float,
                       busy: bool) -> Measurement:
    """Cache a measurement of device `name` (store_measurement) and say, in one warning line, where
    it was busy: stored as such, or not stored because an idle measurement was kept."""
    from salactl.output import warn_once

    entry = {"mem_gbps": mem_gbps, "bf16_tflops": bf16_tflops, "fp32_tflops": fp32_tflops, "busy": bool(busy),
             "measured_at": time.strftime("%Y-%m-%dT%H:%M:%S")}
    in_effect = store_measurement(name, entry)
    stored = in_effect is entry
    measured_at = in_effect.get("measured_at")
    measured_at = measured_at if isinstance(measured_at, str) else None   # a hand-written entry may lack it
    if not stored:
        warn_once(f"the machine is busy; kept the idle measurement of {measured_at or 'an unknown time'} "
                  "instead of this one, re-run --measure when the machine is idle to replace it")
    elif busy:
        warn_once(BUSY_WARNING)
    return Measurement(measured_peaks(name, in_effect), bool(busy), stored, measured_at)


def store_measurement(name: str, entry: dict) -> dict:
    """Add or replace `name`'s entry in the cache (invalid entries are dropped), under a lock so
    that two devices stored at once both stay, and return the entry in effect: a busy entry does not
    replace an idle one (entries without "busy" are idle), which is returned instead. A write that
    fails is a usage error naming the cache file, one the disk has no room for an OutputWriteError."""
    path = cache_path()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with exclusive_lock(path.with_name(path.name + ".lock"), remove=True):
            data = load_measured(warn=False)
            kept = data.get(name)
            if entry.get("busy") and kept is not None and not kept.get("busy", False):
                return kept
            data[name] = entry
            write_atomic(path, json.dumps(data, indent=2))
            return entry
    except DiskFullError as e:
        fix = write_remedy(e.error, "set SALACTL_CACHE_DIR to a directory on another disk")
        raise OutputWriteError(f"cannot write the peaks cache {path}: {e.reason}; {fix}") from e
    except OSError as e:
        raise cannot_write(path, e.strerror or str(e)) from e

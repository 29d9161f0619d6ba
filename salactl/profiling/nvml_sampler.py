"""Sample GPU memory, power, clocks, utilisation and throttle reasons with NVML on a background
thread while the profiled work runs (nvidia-ml-py; reference/kernels_tooling.md §6)."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

from salactl.errors import DeviceError

# nvmlClocksEventReason* / nvmlClocksThrottleReason* bit values (nvml.h).
THROTTLE_REASONS = {
    0x1: "gpu_idle", 0x2: "applications_clocks_setting", 0x4: "sw_power_cap",
    0x8: "hw_slowdown", 0x10: "sync_boost", 0x20: "sw_thermal_slowdown",
    0x40: "hw_thermal_slowdown", 0x80: "hw_power_brake_slowdown", 0x100: "display_clock_setting",
}


def reason_names(mask: int) -> list[str]:
    return [name for bit, name in THROTTLE_REASONS.items() if mask & bit]


def nvml_index(device) -> int:
    """NVML's index of the GPU a step on `device` (a torch.device) runs on (runtime.peaks.nvml_index)."""
    from salactl.runtime.peaks import nvml_index as index_of

    try:
        return index_of(device)
    except RuntimeError as e:
        raise DeviceError(f"cannot tell which GPU NVML numbers {device} ({e}); --nvml needs "
                          "CUDA_VISIBLE_DEVICES to name GPUs NVML sees") from None


@dataclass
class NvmlSampler:
    index: int = 0
    interval_s: float = 0.05
    samples: list[dict] = field(default_factory=list)

    def __post_init__(self) -> None:
        try:
            import pynvml

            pynvml.nvmlInit()
            self._nvml = pynvml
            self._h = pynvml.nvmlDeviceGetHandleByIndex(self.index)
        except Exception as e:  # pynvml.NVMLError, ImportError, missing driver library
            raise DeviceError(f"NVML is not usable here ({type(e).__name__}: {e}); --nvml needs an "
                              "NVIDIA driver and GPU") from None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _read(self) -> dict:
        n, h = self._nvml, self._h
        row = {"t": time.perf_counter()}
        calls = {
            "mem_used_bytes": lambda: n.nvmlDeviceGetMemoryInfo(h).used,
            "power_w": lambda: n.nvmlDeviceGetPowerUsage(h) / 1000.0,
            "sm_clock_mhz": lambda: n.nvmlDeviceGetClockInfo(h, n.NVML_CLOCK_SM),
            "mem_clock_mhz": lambda: n.nvmlDeviceGetClockInfo(h, n.NVML_CLOCK_MEM),
            "gpu_util_pct": lambda: n.nvmlDeviceGetUtilizationRates(h).gpu,
            "throttle_mask": self._throttle,
        }
        for key, fn in calls.items():
            try:
                row[key] = fn()
            except Exception:
                row[key] = None
        return row

    def _throttle(self) -> int:
        n = self._nvml
        fn = getattr(n, "nvmlDeviceGetCurrentClocksEventReasons", None) or \
            n.nvmlDeviceGetCurrentClocksThrottleReasons
        return int(fn(self._h))

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.samples.append(self._read())
            self._stop.wait(self.interval_s)

    def __enter__(self) -> "NvmlSampler":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.samples.append(self._read())

    def summary(self) -> dict:
        out: dict = {"samples": len(self.samples), "interval_s": self.interval_s}
        for key in ("mem_used_bytes", "power_w", "sm_clock_mhz", "mem_clock_mhz", "gpu_util_pct"):
            vals = [s[key] for s in self.samples if s.get(key) is not None]
            if vals:
                out[key] = {"min": min(vals), "max": max(vals), "mean": sum(vals) / len(vals)}
        mask = 0
        for s in self.samples:
            mask |= s.get("throttle_mask") or 0
        out["throttle_reasons"] = reason_names(mask)
        return out

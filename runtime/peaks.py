"""Device ceilings for the roofline: a datasheet table of known GPUs, NVML (bus width × memory
clock), and measured ceilings (`salactl info --measure`, runtime/peaks_measure.py) cached per device."""

from __future__ import annotations

import os
import stat
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from salactl.errors import UsageError
from salactl.reports.records import is_finite_number
from salactl.runtime.json_file import read_json


# name fragment -> (memory GB/s, dense bf16 TFLOP/s, fp32 TFLOP/s or None); vendor datasheets (dense,
# no sparsity). The fp32 rate is the CUDA cores' (no TF32: torch leaves it off for fp32 matmuls), so
# a float32 model's FLOP floor is not the tensor cores'. The most specific fragment wins
# ("GH200" and "H200 NVL" before "H200", "H100 NVL" before "H100").
DATASHEET = {
    "H200 NVL": (4800.0, 835.0, 60.0),
    "H200": (4800.0, 989.0, 67.0),
    "GH200 144G": (4900.0, 989.0, 67.0),
    "GH200": (4000.0, 989.0, 67.0),              # the 96 GB HBM3 part ("NVIDIA GH200 480GB")
    "H100 SXM": (3350.0, 989.0, 67.0),
    "H100 80GB HBM3": (3350.0, 989.0, 67.0),
    "H100 NVL": (3900.0, 835.0, 60.0),
    "H100 PCIe": (2000.0, 756.0, 51.0),
    "H100": (3350.0, 989.0, 67.0),
    "A100-SXM4-80GB": (2039.0, 312.0, 19.5),
    "A100 80GB PCIe": (1935.0, 312.0, 19.5),
    "A100": (1555.0, 312.0, 19.5),
    "RTX PRO 6000D": (1398.0, 148.0, None),
    "RTX PRO 6000": (1792.0, 503.8, None),
    "RTX 5090": (1792.0, 209.5, 104.8),
    "L40S": (864.0, 362.0, 91.6),
}


@dataclass(frozen=True)
class Peaks:
    device: str
    mem_gbps: float
    bf16_tflops: float
    # "measured", "measured while busy" (`info --measure` found the machine busy and had no idle
    # measurement to keep), "datasheet", "nvml bandwidth, default compute" (a GPU not in the datasheet:
    # NVML gives no matmul rate), "unknown-gpu-default", "cpu-default". Records store it: keep it stable.
    source: str
    fp32_tflops: float | None = None     # measured, the datasheet's CUDA-core rate or the CPU default

    def matmul_tflops(self, dtype: torch.dtype) -> tuple[float, str]:
        """The compute ceiling for GEMMs in `dtype`, and which rate it is: a float32 model's
        floor uses the float32 rate where it was measured (on a CPU it can be a third of bf16's)."""
        if dtype == torch.float32 and self.fp32_tflops:
            return self.fp32_tflops, "fp32"
        return self.bf16_tflops, "bf16"

    def to_dict(self) -> dict:
        return asdict(self)

    def for_dtype(self, dtype: torch.dtype, quantized: bool = False) -> dict:
        """to_dict() plus the ceiling a `dtype` model's FLOP floors use: compute_tflops, compute_rate;
        `quantized`: some linears compute in bf16 whatever the model's dtype (W4A16/W8A16 kernels,
        quant/linear.py GPTQLinear.bf16_rows), whose FLOP floors use quantized_compute_tflops and
        quantized_compute_rate, given where that rate is not the model's."""
        tflops, rate = self.matmul_tflops(dtype)
        out = {**self.to_dict(), "compute_tflops": tflops, "compute_rate": rate}
        q_tflops, q_rate = self.matmul_tflops(torch.bfloat16)
        if quantized and q_tflops != tflops:
            out.update(quantized_compute_tflops=q_tflops, quantized_compute_rate=q_rate)
        return out


class CacheDirUnknown(UsageError):
    """Neither SALACTL_CACHE_DIR nor the home directory names a usable peaks cache location."""


def cache_path() -> Path:
    """$SALACTL_CACHE_DIR/peaks.json, else ~/.cache/salactl/peaks.json; CacheDirUnknown when there is
    no home directory (HOME unset for a user without a passwd entry) or the path is a symlink loop."""
    try:
        root = Path(os.environ.get("SALACTL_CACHE_DIR") or Path.home() / ".cache" / "salactl")
        return root.expanduser().resolve() / "peaks.json"
    except (RuntimeError, OSError) as e:    # Path.home(); resolve() raises RuntimeError (3.11-3.12) or OSError ELOOP
        raise CacheDirUnknown(f"cannot locate the peaks cache ({e}); "
                              "set SALACTL_CACHE_DIR to a writable directory") from e


def cpu_model() -> str:
    """The CPU's model name (/proc/cpuinfo), which tells one x86_64 machine from another, else
    what the platform module knows."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name" and value.strip():
                return value.strip()
    except OSError:
        pass
    import platform

    return platform.processor() or platform.machine()


def usable_cpu_count() -> int:
    """The CPUs this process may run on (a container's or taskset's share, not the host's)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"cpu:{cpu_model()}:{usable_cpu_count()}cpus:{torch.get_num_threads()}t"


def datasheet(name: str) -> tuple[float, float, float | None] | None:
    for frag in sorted(DATASHEET, key=len, reverse=True):
        if frag.lower() in name.lower():
            return DATASHEET[frag]
    return None


def nvml_index(device: torch.device) -> int:
    """NVML's index of the GPU `device` is. NVML numbers every GPU of the machine, CUDA only those
    CUDA_VISIBLE_DEVICES shows, in its order: cuda:0 under CUDA_VISIBLE_DEVICES=3 is NVML's GPU 3.
    A CPU device has no GPU of its own: NVML's first. RuntimeError when CUDA_VISIBLE_DEVICES names
    a GPU NVML cannot number."""
    if device.type != "cuda":
        return 0
    # torch.cuda.utilization's own mapping (ordinals or GPU-/MIG- UUIDs in CUDA_VISIBLE_DEVICES)
    return torch.cuda._get_nvml_device_index(device.index or 0)


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


def load_measured(warn: bool = True) -> dict:
    """The cached measurements by device name; an unreadable cache or an entry without two
    positive finite ceilings or with a "busy" that is not true/false (a hand-edited or truncated
    file) is left out, with a warning (`warn`): defaults apply."""
    try:
        path = cache_path()
    except CacheDirUnknown as e:
        if warn:
            from salactl.output import warn_once

            warn_once(f"{e}; the default ceilings apply")
        return {}
    try:
        data = _read_cache(path)
    except (FileNotFoundError, NotADirectoryError):
        return {}
    except OSError as e:        # a directory or FIFO, no permission: --measure cannot rewrite it either
        if warn:
            from salactl.output import warn_once

            warn_once(f"cannot read the peaks cache {path} ({e.strerror or e}); the default ceilings apply")
        return {}
    if not isinstance(data, dict):
        if warn:
            _warn_unusable_cache(f"the peaks cache {path}: it is not a JSON object of measurements")
        return {}
    valid = {name: entry for name, entry in data.items() if _valid(entry)}
    if warn and len(valid) < len(data):
        invalid = len(data) - len(valid)
        _warn_unusable_cache(f"{invalid} entr{'y' if invalid == 1 else 'ies'} of the peaks cache {path}: "
                             "not positive finite ceilings with a true/false busy flag")
    return valid


def _read_cache(path: Path) -> object:
    """peaks.json's JSON; None where its bytes are no JSON we can parse (not UTF-8, not JSON, over
    the side-file size cap, nested too deeply for the parser). OSError where it cannot be read or is
    not a regular file (a FIFO would block the read)."""
    if not stat.S_ISREG(os.stat(path).st_mode):
        raise OSError("not a regular file")
    try:
        return read_json(path, UsageError)
    except UsageError:
        return None


def _warn_unusable_cache(what: str) -> None:
    from salactl.output import warn_once

    warn_once(f"ignoring {what}; `salactl info --measure` rewrites it")


def _valid(entry) -> bool:
    def positive(v):
        return is_finite_number(v) and v > 0

    return (isinstance(entry, dict) and positive(entry.get("mem_gbps")) and positive(entry.get("bf16_tflops"))
            and (entry.get("fp32_tflops") is None or positive(entry["fp32_tflops"]))
            and isinstance(entry.get("busy", False), bool))         # entries from before "busy" were idle


def check_cache_dir() -> Path:
    """The cache file's path, or a usage error before measuring when it cannot be written: its
    directory cannot be looked up (a name too long, no search permission), made or written to, or
    peaks.json is a directory."""
    path = cache_path()
    try:
        existing = next(p for p in path.parents if p.exists())
        if not existing.is_dir():
            raise cannot_write(path, f"{existing} is a file")
        if path.exists() and not path.is_file():
            raise cannot_write(path, "it is a directory" if path.is_dir() else "it is not a regular file")
    except OSError as e:
        raise cannot_write(path, f"cannot look up its directory: {e.strerror or e}") from e
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise cannot_write(path, f"cannot create {e.filename or path.parent}: {e.strerror or e}") from e
    try:
        with tempfile.NamedTemporaryFile(dir=path.parent, prefix=f".{path.name}.", suffix=".probe"):
            pass
    except OSError as e:
        raise cannot_write(path, f"cannot create files in {path.parent}: {e.strerror or e}") from e
    return path


def cannot_write(path: Path, reason: str) -> Exception:
    from salactl.errors import UsageError

    return UsageError(f"cannot write the peaks cache {path}: {reason}; "
                      "set SALACTL_CACHE_DIR to a writable directory")


def peaks_for(device: torch.device) -> Peaks:
    try:
        index = nvml_index(device)
    except RuntimeError:
        index = None
    return peaks_by_name(device_name(device), device.type, index)


def peaks_by_name(name: str, device_type: str, nvml_index: int | None = None) -> Peaks:
    """Measured ceilings for `name` if cached, else the datasheet, NVML's bandwidth (when an index
    is given) or a default."""
    measured = load_measured().get(name)
    if measured:
        return measured_peaks(name, measured)
    if device_type == "cuda":
        ds = datasheet(name)
        if ds:
            return Peaks(name, ds[0], ds[1], "datasheet", ds[2])
        bw = nvml_bandwidth_gbps(nvml_index) if nvml_index is not None else None
        if bw:
            return Peaks(name, bw, 100.0, "nvml bandwidth, default compute")
        return Peaks(name, 1000.0, 100.0, "unknown-gpu-default")
    # No CPU datasheet: a conservative default until `salactl info --measure` runs.
    return Peaks(name, 20.0, 0.2, "cpu-default", fp32_tflops=0.2)


def measured_peaks(name: str, entry: dict) -> Peaks:
    """The ceilings of a valid cache entry (load_measured), labelled busy where it was measured so."""
    source = "measured while busy" if entry.get("busy") else "measured"
    return Peaks(name, entry["mem_gbps"], entry["bf16_tflops"], source, entry.get("fp32_tflops"))

"""The environment block attached to every result record (DESIGN.md §4)."""

from __future__ import annotations

import importlib.metadata
import platform
import subprocess
from pathlib import Path

import torch

import salactl
from salactl.runtime.peaks import cpu_model, usable_cpu_count


def _git(root: Path = Path(__file__).resolve().parent.parent) -> dict:
    """salactl's own commit, from a source checkout only: an installed package's parent folder
    (site-packages) may sit inside some other repository, whose commit is not ours."""
    if not ((root / ".git").exists() and (root / "pyproject.toml").is_file()):
        return {"git_sha": None, "git_dirty": None}
    try:
        sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True,
                             timeout=5).stdout.strip()
        dirty = bool(subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root,
                                    capture_output=True, text=True, timeout=5).stdout.strip())
        return {"git_sha": sha or None, "git_dirty": dirty if sha else None}
    except (OSError, subprocess.SubprocessError):
        return {"git_sha": None, "git_dirty": None}


def _gpu() -> dict:
    if not torch.cuda.is_available():
        return {"gpu": None}
    info = {"gpu": torch.cuda.get_device_name(0), "cuda": torch.version.cuda,
            "gpu_count": torch.cuda.device_count()}
    try:
        import pynvml

        from salactl.runtime.peaks import nvml_index

        pynvml.nvmlInit()
        h = pynvml.nvmlDeviceGetHandleByIndex(nvml_index(torch.device("cuda", 0)))   # the GPU "gpu" names
        info.update(
            driver=pynvml.nvmlSystemGetDriverVersion(),
            power_limit_w=pynvml.nvmlDeviceGetEnforcedPowerLimit(h) / 1000,
            sm_clock_mhz=pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM),
            mem_clock_mhz=pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_MEM),
        )
    except Exception:
        pass
    return info


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def environment() -> dict:
    try:
        import triton

        triton_version = triton.__version__
    except Exception:
        triton_version = None
    return {
        **_git(),
        "salactl": salactl.__version__,
        "torch": torch.__version__,
        "triton": triton_version,
        "fla_core": _version("fla-core"),
        "python": platform.python_version(),
        "cpu": cpu_model(),
        "cpu_count": usable_cpu_count(),
        "torch_threads": torch.get_num_threads(),
        **_gpu(),
    }

"""Whether the GPU engine can run here (CUDA visible and Triton importable). Imports nothing
heavy, so CPU-only installs without triton keep working."""

from __future__ import annotations

import importlib.util

import torch


def gpu_engine_available(device=None) -> bool:
    if importlib.util.find_spec("triton") is None:
        return False
    if device is not None and torch.device(device).type != "cuda":
        return False
    return torch.cuda.is_available()

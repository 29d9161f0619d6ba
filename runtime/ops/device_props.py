"""Device properties the kernel launch policies size their grids by."""

from __future__ import annotations

import torch

# Off CUDA the kernels run in Triton's CPU interpreter, one program after another: a grid sized for
# an H200's 132 SMs only costs time there. 8, not fewer, keeps the interpreter tests' batches (up to
# 16 selection rows) on more than one split, as the launch policies split on a GPU.
INTERPRETER_SMS = 8

_SM_COUNT: dict[int, int] = {}


def sm_count(device: torch.device) -> int:
    """Streaming multiprocessors of a CUDA device; INTERPRETER_SMS elsewhere."""
    if device.type != "cuda":
        return INTERPRETER_SMS
    idx = device.index if device.index is not None else torch.cuda.current_device()
    if idx not in _SM_COUNT:
        _SM_COUNT[idx] = torch.cuda.get_device_properties(idx).multi_processor_count
    return _SM_COUNT[idx]

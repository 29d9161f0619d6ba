"""Programmatic dependent launch (PDL, sm_90+) for the decode-step kernels.

A CUDA-graph decode step is ~400 kernels, and BENCHMARKS.md measured 0.2-0.35 ms of it as gaps
between them: the next kernel is only launched once the previous one has fully drained. Launched
with PDL (`launch_pdl=True`, kept by stream capture as a programmatic graph edge), a kernel's CTAs
are launched as soon as every CTA of the previous kernel has called `griddepcontrol.launch_dependents`,
so its launch and prologue overlap the previous kernel's tail.

The rule that keeps this exact: every kernel launched with PDL calls `pdl_wait(PDL)` in every
program before its first global memory access (loads, stores and atomics: a later kernel may
overwrite what an earlier one still reads). `griddepcontrol.wait` returns once the previous grid has
completed and its writes are visible; since that grid itself waited on its predecessor, a kernel
never completes before any earlier one, and every earlier write is visible after the wait.
The trigger comes right after the wait, so dependents are launched no earlier than this kernel's
real start (and only once all its CTAs are resident: no starvation).
One exception follows from the same ordering: a kernel is launched only once every CTA of its
predecessor has passed that predecessor's wait, so every kernel before the predecessor has
completed. Loads of data that the immediately preceding kernel does not write may therefore come
before the wait (decode attention's `DecodeConfig.early` reads slots and seq_lens this way, and
the selection's pass 2 q, the page table and all of K1 but the window the lse pass writes), and
data no kernel of the step writes may always be read early (the W4A16 kernels' `early` L2 prefetch
of their first weight tiles).

`launch_args(device)` gives the two launch keywords (`PDL` constexpr and `launch_pdl`); off under
the Triton interpreter, on GPUs before sm_90, and with SALACTL_PDL=0 (for A/B measurements).
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from salactl.runtime.ops.interpreter_compat import squeeze_interpreter_indices

squeeze_interpreter_indices()   # every kernel module imports this one: Triton < 3.7's interpreter under NumPy 2.4

_CAPABLE: dict[int, bool] = {}


def is_sm90(device: torch.device) -> bool:
    """A CUDA device of compute capability 9.0 or newer (Hopper: PDL, TMA), cached per device."""
    idx = device.index if device.index is not None else torch.cuda.current_device()
    if idx not in _CAPABLE:
        _CAPABLE[idx] = torch.cuda.get_device_capability(idx)[0] >= 9
    return _CAPABLE[idx]


def enabled(device: torch.device) -> bool:
    if device.type != "cuda" or os.environ.get("TRITON_INTERPRET") == "1":
        return False
    if os.environ.get("SALACTL_PDL", "1") == "0":
        return False
    return is_sm90(device)


def launch_args(device: torch.device) -> dict:
    """Keywords for a kernel launch: the kernel's `PDL` constexpr and Triton's `launch_pdl`."""
    on = enabled(device)
    return {"PDL": on, "launch_pdl": on}


@triton.jit
def pdl_wait(PDL: tl.constexpr):
    """Call first in every program of a kernel launched with `launch_args` (see the module docstring)."""
    if PDL:
        gdc_wait()
        gdc_launch_dependents()

"""A barrier across the programs of one row of a Triton grid, for kernels whose programs all
run at once (a "resident" grid), and what sizes such a grid.

Hand-written because Triton has no grid-wide synchronisation (cooperative launch) and torch
none for Triton kernels. The barrier's counters live in a buffer allocated once per (device,
stream), zero at allocation: the count returns to 0 after every barrier and the flag only ever
moves on, so CUDA graphs replay it without host state. A program spinning in the barrier waits
for programs that must already be running, so the grid must never exceed what the GPU holds at
once: `resident_programs` computes that from the compiled kernel's registers, shared memory and
warps. The Triton interpreter runs programs one after another, so it can never pass a barrier:
callers keep a barrier-free path for it.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

_BUFFERS: dict[tuple, torch.Tensor] = {}
_SM_SHARED_BYTES_RESERVED = 1024       # per CTA (sm_80 / sm_90)


def barrier_counters(device: torch.device, rows: int) -> torch.Tensor:
    """[2 * rows] int32 (count, flag per row), zero the first time; sized once (at least 4096
    rows) so CUDA graphs captured later keep pointing at the same buffer."""
    key = (device, torch.cuda.current_stream(device).stream_id if device.type == "cuda" else 0)
    buf = _BUFFERS.get(key)
    if buf is None or buf.numel() < 2 * rows:
        buf = torch.zeros(2 * max(rows, 4096), dtype=torch.int32, device=device)
        _BUFFERS[key] = buf
    return buf


def resident_programs(compiled, device: torch.device) -> int:
    """How many programs of a compiled Triton kernel the device runs at once (all SMs)."""
    compiled._init_handles()
    props = triton.runtime.driver.active.utils.get_device_properties(device.index or 0)
    warps = compiled.metadata.num_warps
    regs_per_warp = -(-compiled.n_regs * 32 // 256) * 256          # allocated per warp, 256 at a time
    by_regs = props["max_num_regs"] // regs_per_warp // warps
    shared = compiled.metadata.shared
    sm_shared = props["max_shared_mem"] + _SM_SHARED_BYTES_RESERVED
    by_shared = sm_shared // (shared + _SM_SHARED_BYTES_RESERVED) if shared else 32
    per_sm = min(by_regs, by_shared, 64 // warps, 32)
    return per_sm * props["multiprocessor_count"]


@triton.jit
def row_barrier(cnt_ptr, flag_ptr, arrivals):
    """Every one of the row's `arrivals` programs waits here until all have arrived; the stores
    each made before it are then visible to all. A program reads the flag before it arrives, and
    the last arrival moves the flag only after every other arrival, so no program can miss it."""
    tl.debug_barrier()                                # every warp's stores issued before the release
    flag0 = tl.atomic_add(flag_ptr, 0, sem="acquire")
    if tl.atomic_add(cnt_ptr, 1, sem="acq_rel") == arrivals - 1:
        tl.atomic_xchg(cnt_ptr, 0, sem="relaxed")
        tl.atomic_add(flag_ptr, 1, sem="release")
    else:
        cur = tl.atomic_add(flag_ptr, 0, sem="acquire")
        while cur == flag0:
            cur = tl.atomic_add(flag_ptr, 0, sem="acquire")
    tl.debug_barrier()

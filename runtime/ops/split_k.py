"""Split-K finished in one launch, shared by our GEMM kernels (W4A16 triton_tc.py, the skinny bf16
GEMM): each split writes its fp32 partial tile to a workspace and takes a per-tile ticket; the last
split of a tile sums the partials in split order (deterministic) and writes y. No reduction kernel.
With GLU the tile's first half of rows is the gate and its second half the up projection of the
same outputs, and the store is silu(gate)·up (the MLP's silu·mul as an epilogue, `_store_y`).

The tickets are one int32 buffer per device, zero between calls because every kernel resets the
tickets it used, so kernels using it must not run concurrently (the engine runs one stream at a
time). It is allocated outside any CUDA graph capture and never freed: a larger grid gets a larger
buffer and the old one is kept, since captured graphs keep its address. (It was once one buffer per
stream; the capture stream's was allocated inside a capture, in that graph's memory pool, and zeroed
only when that graph replayed, so a graph captured after it that replayed first read garbage
tickets: NaN logits in batched sala-9b decode, session 50.) Import lazily: CPU-only installs have
no triton."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

TICKETS = 1 << 16          # initial size in tiles: every decode-sized grid fits; prefill grids may grow it
_BUFFERS: dict[torch.device, torch.Tensor] = {}
_RETIRED: list[torch.Tensor] = []      # outgrown buffers, kept: captured graphs still use their addresses


def split_counters(device: torch.device, n: int) -> torch.Tensor:
    """The device's ticket buffer, at least n long."""
    buf = _BUFFERS.get(device)
    if buf is None or buf.numel() < n:
        if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            raise RuntimeError("split-K tickets first needed inside a CUDA graph capture, where they would "
                               "not be zeroed until that graph replays; run the forward once eagerly "
                               "before capturing it")
        if buf is not None:
            _RETIRED.append(buf)
        buf = _BUFFERS[device] = torch.zeros(max(n, TICKETS), dtype=torch.int32, device=device)
    return buf


@triton.jit
def _store_y(total, y_ptr, offs_m, offs_n, mask, M, N, stride_ym, glu_n0, GLU: tl.constexpr):
    """y = total, or (GLU) silu(gate)·up of y's rows glu_n0 .. glu_n0 + BN/2 from total's two row
    halves, with the rounding points of the separate kernels (runtime/ops/fused silu_mul on the
    GEMM's bf16 output), so the result is the unfused path's bit for bit."""
    DT = y_ptr.dtype.element_ty
    if GLU:
        BN: tl.constexpr = total.shape[0]
        BM: tl.constexpr = total.shape[1]
        g, u = tl.split(tl.permute(tl.reshape(total, (2, BN // 2, BM)), (1, 2, 0)))
        g = g.to(DT).to(tl.float32)
        a = (g * tl.sigmoid(g)).to(DT).to(tl.float32)
        rn = glu_n0 + tl.arange(0, BN // 2)
        tl.store(y_ptr + offs_m[None, :] * stride_ym + rn[:, None], (a * u.to(DT).to(tl.float32)).to(DT),
                 mask=(offs_m < M)[None, :] & (rn < N // 2)[:, None])
    else:
        tl.store(y_ptr + offs_m[None, :] * stride_ym + offs_n[:, None], total.to(DT), mask=mask)


@triton.jit
def store_split_k(acc, y_ptr, ws_ptr, cnt_ptr, tile, pid_k, split_k, offs_m, offs_n, mask, M, N, stride_ym,
                  RED: tl.constexpr, glu_n0=0, GLU: tl.constexpr = False):
    """Write acc [BN, BM] (rows offs_n, columns offs_m of y, i.e. yᵀ) to y, through the workspace
    [split_k, M, N] fp32 and ticket `tile` when split_k > 1. RED > 1: the last split loads RED
    partials at a time (all in flight at once, not one L2 round trip each). GLU: y is [M, N/2] and
    gets silu(gate)·up (`_store_y`; N counts both halves)."""
    if split_k == 1:
        _store_y(acc, y_ptr, offs_m, offs_n, mask, M, N, stride_ym, glu_n0, GLU)
    else:
        w_off = offs_m[None, :] * N + offs_n[:, None]
        tl.store(ws_ptr + pid_k * M * N + w_off, acc, mask=mask)
        tl.debug_barrier()
        if tl.atomic_add(cnt_ptr + tile, 1, sem="acq_rel") == split_k - 1:
            total = tl.zeros(acc.shape, tl.float32)
            if RED == 1:
                for sk in range(0, split_k):
                    total += tl.load(ws_ptr + sk * M * N + w_off, mask=mask, other=0.0, cache_modifier=".cg")
            else:
                # RED independent loads in acc's own layout, then the adds in split order (the same
                # sums as RED = 1). One [RED, BN, BM] load summed over its first axis, the earlier
                # form, ran at 0.3-0.9x of RED = 1 on the H200 (BENCHMARKS.md, W4A16 session 15;
                # cause not isolated: offline it used no more registers or shared memory)
                for sk0 in range(0, split_k, RED):
                    for j in tl.static_range(RED):
                        live = mask & (w_off * 0 + sk0 + j < split_k)
                        total += tl.load(ws_ptr + (sk0 + j) * M * N + w_off, mask=live, other=0.0, cache_modifier=".cg")
            _store_y(total, y_ptr, offs_m, offs_n, mask, M, N, stride_ym, glu_n0, GLU)
            tl.atomic_xchg(cnt_ptr + tile, 0)

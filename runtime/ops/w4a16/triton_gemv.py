"""Small-batch W4A16 GEMV on CUDA cores (our own Triton kernel; triton.py says why hand-written).

For a few rows the tensor-core kernel spends its time moving activation slabs through shared
memory; this one keeps everything in registers: each program streams a [16 word rows, BLOCK_N]
tile of the interleaved layout (layout.py) per 128-row K block, and for nibble j computes
w = bitcast_f32((q >> 4j) & 0xF | 0x4B000000) − (2^23 + 8) = q − 8 exactly (no int->float
conversion), then one FMA per weight and row. Partial sums stay [BM, 16, BLOCK_N] until the end.

Split-K without extra launches: each split writes fp32 partials to a workspace and bumps a
per-tile counter; the last split of a tile (acq_rel atomics) adds the partials, writes the output
in the activation dtype and resets the counter to 0 for the next call. Counters are per device
and stream, so concurrent calls on one stream are ordered; do not share one across streams.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from salactl.runtime.ops.w4a16.layout import K_BLOCK


@triton.jit
def _w4a16_gemv_kernel(x_ptr, qw_ptr, s_ptr, y_ptr, ws_ptr, cnt_ptr, M, N, K, stride_xm, stride_ym, split_k,
                       GROUP: tl.constexpr, BLOCK_N: tl.constexpr, UNROLL: tl.constexpr):
    """One activation row per program (grid axis 2): every tensor is 2-D [16, BLOCK_N] in the
    load's own layout, so nothing goes through shared memory."""
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    m = tl.program_id(2)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = offs_n < N
    r = tl.arange(0, 16)
    nkb = K // 128
    per = tl.cdiv(nkb, split_k)
    kb0 = pid_k * per
    kb1 = tl.minimum(kb0 + per, nkb)
    x_row = x_ptr + m * stride_xm
    acc = tl.zeros((16, BLOCK_N), tl.float32)
    for kb_base in range(kb0, kb1, UNROLL):
        for u in tl.static_range(UNROLL):               # UNROLL blocks in flight per iteration
            kb = kb_base + u
            vr = (r * 0 + kb) < kb1                          # masked x makes an invalid block add 0
            vn = n_mask & ((offs_n * 0 + kb) < kb1)
            q = tl.load(qw_ptr + (kb * 16 + r)[:, None] * N + offs_n[None, :], mask=vr[:, None] & vn[None, :],
                        other=0)
            q_hi = q >> 20                                   # nibbles 5..7 at bits 0..11
            blk = tl.zeros((16, BLOCK_N), tl.float32)
            for j in tl.static_range(8):
                # nibble jj of `src` stays in place: (src & 0xF<<4jj | 2^23 bits) - (2^23 + 8·16^jj)
                # = (q - 8)·16^jj exactly; the activation is pre-scaled by 16^-jj (a power of two).
                if j < 5:
                    w = ((q & (0xF << (4 * j))) | 0x4B000000).to(tl.float32, bitcast=True) - (8388608.0 + 8.0 * 16 ** j)
                    xj = tl.load(x_row + kb * 128 + j * 16 + r, mask=vr, other=0.0).to(tl.float32) * (1.0 / 16 ** j)
                else:
                    w = ((q_hi & (0xF << (4 * (j - 5)))) | 0x4B000000).to(tl.float32, bitcast=True) \
                        - (8388608.0 + 8.0 * 16 ** (j - 5))
                    xj = tl.load(x_row + kb * 128 + j * 16 + r, mask=vr, other=0.0).to(tl.float32) \
                        * (1.0 / 16 ** (j - 5))
                if GROUP < 128:
                    sj = tl.load(s_ptr + ((kb * 128 + j * 16) // GROUP) * N + offs_n, mask=vn,
                                 other=0.0)
                    blk += w * (xj[:, None] * sj.to(tl.float32)[None, :])
                else:
                    blk += w * xj[:, None]
            if GROUP >= 128:
                s = tl.load(s_ptr + ((kb * 128) // GROUP) * N + offs_n, mask=vn, other=0.0)
                acc += blk * s.to(tl.float32)[None, :]
            else:
                acc += blk
    part = tl.sum(acc, axis=0)                                               # [BLOCK_N]
    y_ptrs = y_ptr + m * stride_ym + offs_n
    if split_k == 1:
        tl.store(y_ptrs, part.to(y_ptr.dtype.element_ty), mask=n_mask)
    else:
        tl.store(ws_ptr + (pid_k * M + m) * N + offs_n, part, mask=n_mask)
        tile = m * tl.num_programs(0) + pid_n
        done = tl.atomic_add(cnt_ptr + tile, 1, sem="acq_rel")
        if done == split_k - 1:
            total = tl.zeros((BLOCK_N,), tl.float32)
            for sk in range(0, split_k):
                total += tl.load(ws_ptr + (sk * M + m) * N + offs_n, mask=n_mask, other=0.0, cache_modifier=".cg")
            tl.store(y_ptrs, total.to(y_ptr.dtype.element_ty), mask=n_mask)
            tl.atomic_xchg(cnt_ptr + tile, 0)


_COUNTERS: dict[tuple, torch.Tensor] = {}


def _counters(device: torch.device, n: int) -> torch.Tensor:
    key = (device, torch.cuda.current_stream(device).stream_id if device.type == "cuda" else 0)
    buf = _COUNTERS.get(key)
    if buf is None or buf.numel() < n:
        buf = torch.zeros(max(n, 4096), dtype=torch.int32, device=device)
        _COUNTERS[key] = buf
    return buf


def w4a16_gemv(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor, group_size: int,
               block_n: int = 128, split_k: int | None = None, num_warps: int = 4,
               sms: int = 132, num_stages: int = 1, unroll: int = 1) -> torch.Tensor:
    """x [M, K] (bf16/fp16, small M) · W^T -> [M, N] in x's dtype."""
    M, K = x.shape
    N = qweight.shape[1]
    assert qweight.shape[0] * 8 == K and K % K_BLOCK == 0
    group = K if group_size == -1 else group_size
    assert group % 16 == 0 and (group % 128 == 0 or 128 % group == 0), f"unsupported group size {group}"
    if x.stride(-1) != 1:
        x = x.contiguous()
    tiles_n = triton.cdiv(N, block_n)
    if split_k is None:
        split_k = max(1, min(K // K_BLOCK, triton.cdiv(2 * sms, tiles_n * M)))
    y = torch.empty(M, N, device=x.device, dtype=x.dtype)
    ws = torch.empty(split_k if split_k > 1 else 1, M, N, device=x.device, dtype=torch.float32)
    cnt = _counters(x.device, tiles_n * M)
    _w4a16_gemv_kernel[(tiles_n, split_k, M)](
        x, qweight, scales, y, ws, cnt, M, N, K, x.stride(0), y.stride(0), split_k,
        GROUP=group, BLOCK_N=block_n, UNROLL=unroll, num_warps=num_warps, num_stages=num_stages)
    return y

"""Skinny bf16 GEMM y = x·Wᵀ for small decode batches (2 <= M <= 64 rows), our Triton kernel.

Hand-written because cuBLAS picks split-K tiles for the 4096-wide decode projections at batch
8-32 (measured on the H200 at batch 32: o_proj 4096x4096 in a 64x32 split-K GEMM at 59% of copy
bandwidth plus a separate reduce kernel). Here each program owns BN weight rows and walks K (or
1/SPLIT of it), multiplying W[BN, BK]·xᵀ[BK, BM] on tensor cores, x padded to BM = max(16, next
power of 2 of M) columns; the weights are read once. With SPLIT > 1 the splits write fp32
partials and the last split of a row tile (per-tile ticket) sums them in split order and writes
y: no reduction kernel either (ncu, session 5: with 128 one-CTA-per-SM programs of 4 warps the
o_proj at 32 rows issues on 16% of cycles, stalled on its shared-memory pipeline, DRAM 43%).
Floor: N·K·2 bytes; 4096x4096 = 33.6 MB = 8.0 µs at 4.2 TB/s. Which (N, K, BM) use it and with which block
shape (`SKINNY_CONFIGS`) come from benchmarks/skinny_gemm_bench.py (BENCHMARKS.md).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from salactl.runtime.ops.pdl import launch_args, pdl_wait
from salactl.runtime.ops.split_k import split_counters, store_split_k

# (BN, BK, num_warps, num_stages, split) per (N, K, BM) routed here; every other shape uses cuBLAS.
# o_proj (split 2) and the sparse projection beat cuBLAS alone at 2-32 rows; qkvz, gate+up and down
# only in the step, where our kernels are PDL-launched and cuBLAS's are not; BM 64 lost on every
# shape (BENCHMARKS.md, GPU engine sessions 4, 5, 7).
SKINNY_CONFIGS: dict[tuple[int, int, int], tuple[int, int, int, int, int]] = {
    (4096, 4096, 16): (64, 128, 4, 4, 2), (4096, 4096, 32): (64, 128, 4, 4, 2),
    (8704, 4096, 16): (64, 128, 4, 4, 1), (8704, 4096, 32): (64, 128, 4, 4, 1),
    (16384, 4096, 16): (64, 128, 4, 4, 1), (16384, 4096, 32): (64, 128, 4, 4, 1),
    (32768, 4096, 16): (64, 128, 4, 4, 1), (32768, 4096, 32): (64, 128, 4, 4, 1),
    (4096, 16384, 16): (64, 128, 4, 4, 2), (4096, 16384, 32): (64, 128, 4, 4, 2)}
CANDIDATE_CONFIGS = ((16, 128, 4, 4, 1), (16, 256, 4, 3, 1), (32, 128, 4, 4, 1), (32, 256, 4, 3, 1),
                     (64, 128, 4, 4, 1), (32, 128, 4, 6, 1), (64, 64, 4, 6, 1), (16, 512, 4, 2, 1),
                     # split K: 2-4 programs per SM instead of one
                     (32, 128, 4, 6, 2), (32, 128, 4, 4, 4), (64, 128, 4, 4, 2), (64, 128, 4, 4, 3),
                     (16, 128, 4, 6, 2), (32, 256, 4, 3, 2))


def block_m(m: int) -> int:
    return max(16, triton.next_power_of_2(m))


@triton.jit
def skinny_tile(M, N, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    """A program's (row tile, split) of a split-K skinny GEMM over grid (N tiles, splits): its
    output rows rn, activation rows rm, step columns rk and the row masks."""
    rn = tl.program_id(0) * BN + tl.arange(0, BN)
    rm = tl.arange(0, BM)
    return rn, rm, tl.arange(0, BK), rn < N, rm < M


@triton.jit
def _skinny_kernel(x_ptr, w_ptr, y_ptr, ws_ptr, cnt_ptr, M, N, K, stride_xm, stride_wn, stride_ym, split_k,
                   BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, PDL: tl.constexpr = False):
    pdl_wait(PDL)
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    rn, rm, rk, nmask, mmask = skinny_tile(M, N, BM, BN, BK)
    per = tl.cdiv(tl.cdiv(K, BK), split_k) * BK
    k_lo = pid_k * per
    k_hi = tl.minimum(k_lo + per, K)
    acc = tl.zeros((BN, BM), tl.float32)
    for k0 in range(k_lo, k_hi, BK):
        kmask = k0 + rk < K
        w = tl.load(w_ptr + rn[:, None].to(tl.int64) * stride_wn + (k0 + rk)[None, :],
                    mask=nmask[:, None] & kmask[None, :], other=0.0)
        xt = tl.load(x_ptr + rm[None, :] * stride_xm + (k0 + rk)[:, None],
                     mask=mmask[None, :] & kmask[:, None], other=0.0)
        acc = tl.dot(w, xt, acc)
    store_split_k(acc, y_ptr, ws_ptr, cnt_ptr, pid_n, pid_k, split_k, rm, rn, nmask[:, None] & mmask[None, :],
                  M, N, stride_ym, 1)


def skinny_linear(x: torch.Tensor, w: torch.Tensor, config: tuple[int, int, int, int, int]) -> torch.Tensor:
    """x [M, K] (2 <= M <= 64), w [N, K] (unit last strides, same 16-bit dtype) -> [M, N]."""
    M, K = x.shape
    N = w.shape[0]
    assert w.shape[1] == K and 1 <= M <= 64 and x.stride(1) == 1 and w.stride(1) == 1
    bn, bk, warps, stages, split = config
    split = max(1, min(split, triton.cdiv(K, bk)))
    y = torch.empty(M, N, device=x.device, dtype=x.dtype)
    ws = torch.empty(split if split > 1 else 1, M, N, device=x.device, dtype=torch.float32)
    grid = (triton.cdiv(N, bn), split)
    cnt = split_counters(x.device, grid[0])
    _skinny_kernel[grid](x, w, y, ws, cnt, M, N, K, x.stride(0), w.stride(0), y.stride(0), split,
                         BM=block_m(M), BN=bn, BK=bk, num_warps=warps, num_stages=stages,
                         **launch_args(x.device))
    return y


def routed(x: torch.Tensor, w: torch.Tensor) -> tuple[int, int, int, int, int] | None:
    """The measured config when x·wᵀ should run here, else None (cuBLAS)."""
    if x.dim() != 2 or not 2 <= x.shape[0] <= 64 or x.dtype not in (torch.bfloat16, torch.float16):
        return None
    return SKINNY_CONFIGS.get((w.shape[0], w.shape[1], block_m(x.shape[0])))

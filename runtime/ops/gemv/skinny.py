"""Skinny bf16 GEMM y = x·Wᵀ for small decode batches (2 <= M <= 64 rows), our Triton kernel.

Hand-written because cuBLAS picks split-K tiles for the 4096-wide decode projections at batch
8-32 (measured on the H200 at batch 32: o_proj 4096x4096 in a 64x32 split-K GEMM at 59% of copy
bandwidth plus a separate reduce kernel). Here each program owns BN full weight rows, walks all
of K (no split, so no reduction kernel) and multiplies W[BN, BK]·xᵀ[BK, BM] on tensor cores, x
padded to BM = max(16, next power of 2 of M) columns; the weights are read once. Floor: N·K·2
bytes; 4096x4096 = 33.6 MB = 8.0 µs at 4.2 TB/s. Which (N, K, BM) use it and with which block
shape (`SKINNY_CONFIGS`) come from benchmarks/skinny_gemm_bench.py (BENCHMARKS.md).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

# (BN, BK, num_warps, num_stages) per (N, K, BM) routed here; every other shape uses cuBLAS.
# H200, session 4 (`python benchmarks/skinny_gemm_bench.py`, graph over > 200 MB of weights):
# sparse q/k/v/o_gate 8704x4096 at M 8/16/32: 21.9-22.3 vs cuBLAS 26.3-27.4 us (1.19-1.23x);
# o_proj 4096x4096: 12.7-13.9 vs 13.2-14.4 us (1.03-1.05x). The 16384/32768-row projections and
# down were within 3% of cuBLAS or slower; every shape at M 64 (BM 64) was slower.
SKINNY_CONFIGS: dict[tuple[int, int, int], tuple[int, int, int, int]] = {
    (4096, 4096, 16): (32, 128, 4, 6), (4096, 4096, 32): (32, 128, 4, 6),
    (8704, 4096, 16): (64, 128, 4, 4), (8704, 4096, 32): (64, 128, 4, 4)}
CANDIDATE_CONFIGS = ((16, 128, 4, 4), (16, 256, 4, 3), (32, 128, 4, 4), (32, 256, 4, 3), (64, 128, 4, 4),
                     (32, 128, 4, 6), (64, 64, 4, 6), (16, 512, 4, 2))


def block_m(m: int) -> int:
    return max(16, triton.next_power_of_2(m))


@triton.jit
def _skinny_kernel(x_ptr, w_ptr, y_ptr, M, N, K, stride_xm, stride_wn, stride_ym,
                   BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    rn = tl.program_id(0) * BN + tl.arange(0, BN)
    rm = tl.arange(0, BM)
    rk = tl.arange(0, BK)
    nmask = rn < N
    mmask = rm < M
    acc = tl.zeros((BN, BM), tl.float32)
    for k0 in range(0, K, BK):
        kmask = k0 + rk < K
        w = tl.load(w_ptr + rn[:, None].to(tl.int64) * stride_wn + (k0 + rk)[None, :],
                    mask=nmask[:, None] & kmask[None, :], other=0.0)
        xt = tl.load(x_ptr + rm[None, :] * stride_xm + (k0 + rk)[:, None],
                     mask=mmask[None, :] & kmask[:, None], other=0.0)
        acc = tl.dot(w, xt, acc)
    tl.store(y_ptr + rm[None, :] * stride_ym + rn[:, None], acc.to(y_ptr.dtype.element_ty),
             mask=nmask[:, None] & mmask[None, :])


def skinny_linear(x: torch.Tensor, w: torch.Tensor, config: tuple[int, int, int, int]) -> torch.Tensor:
    """x [M, K] (2 <= M <= 64), w [N, K] (unit last strides, same 16-bit dtype) -> [M, N]."""
    M, K = x.shape
    N = w.shape[0]
    assert w.shape[1] == K and 1 <= M <= 64 and x.stride(1) == 1 and w.stride(1) == 1
    bn, bk, warps, stages = config
    y = torch.empty(M, N, device=x.device, dtype=x.dtype)
    _skinny_kernel[(triton.cdiv(N, bn),)](x, w, y, M, N, K, x.stride(0), w.stride(0), y.stride(0),
                                          BM=block_m(M), BN=bn, BK=bk, num_warps=warps, num_stages=stages)
    return y


def routed(x: torch.Tensor, w: torch.Tensor) -> tuple[int, int, int, int] | None:
    """The measured config when x·wᵀ should run here, else None (cuBLAS)."""
    if x.dim() != 2 or not 2 <= x.shape[0] <= 64 or x.dtype not in (torch.bfloat16, torch.float16):
        return None
    return SKINNY_CONFIGS.get((w.shape[0], w.shape[1], block_m(x.shape[0])))

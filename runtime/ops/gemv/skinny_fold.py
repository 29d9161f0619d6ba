"""The skinny GEMM (skinny.py, 2-64 rows) with the op producing o_proj's input folded into its
prologue: the batch-1 folds of fused.py ("norm_gate", "gate") for decode batches 2-64.

At batch 8-32 the decode step runs a separate o_norm(o)·sigmoid(z) kernel (24 lightning layers) or
o·sigmoid(o_gate) kernel (8 sparse layers) and then the skinny o_proj 4096x4096: 32 small kernels,
their launch gaps, and a write + re-read of the [M, 4096] gated activations per step. Here the
skinny kernel builds its xᵀ tile [BK, BM] from o, z (and γ) while the weights stream, so that
kernel and its output round trip go away; each program reads o and z instead of x for its K range:
twice the activation bytes from L2 (o_proj at 32 rows with BN 64, split 2: 256 KB per program, as
much as its weights; 32 MB over the 128 programs vs 16 MB for x). Taller tiles with more splits at
the same program count (BN 128, split 4) halve that, hence such candidates. No library has these
fusions, hence hand-written.

- "gate":      y = W·round(o·round(sigmoid(g))): the xᵀ tile is exactly the sigmoid_gate kernel's
               output, so y is bit-identical to sigmoid_gate + skinny_linear with the same config.
- "norm_gate": y_m = r_m · W·round(γ ⊙ round(o_m) ⊙ round(sigmoid(z_m))), r_m = rsqrt(mean_K(
               round(o_m)²) + ε) per row m over the whole K, applied to the fp32 sum (like the
               batch-1 fold; the separate rmsnorm_gate kernel rounds o·r, then ·γ, then ·sigmoid).
               The tile is rounded to the weights' dtype once more than in the batch-1 fold
               because the tensor-core dot takes 16-bit operands: rounding differences only.

r_m needs Σ_K o_m² but with split-K a program sees 1/SPLIT of K. Two ways were weighed: every
program re-reading its rows' whole o for the sum (an extra M·K·(1-1/SPLIT)·2 bytes from L2 per
program: 128 KB at 32 rows, 16 MB over the 128 programs of o_proj, half the weight bytes, and the
sum's instructions for the whole K in every program), or
each split summing the squares of the o it already loads (free: same registers) and the last
split of a row tile, which already sums the fp32 partials (split_k.store_split_k), also summing
the SPLIT partial sums of squares (BM floats each) and scaling before rounding. The second is
used (store_split_k's ROW_RMS). Which (N, K, BM, kind) fold and with which block shape is
FOLD_SKINNY_CONFIGS, from benchmarks/skinny_gemm_bench.py --fold. Launched with programmatic
dependent launch where ops/pdl.py enables it (pdl_wait before the first global access).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from salactl.runtime.ops.gemv.skinny import block_m, program_tile
from salactl.runtime.ops.pdl import launch_args, pdl_wait
from salactl.runtime.ops.split_k import split_counters, store_split_k

KINDS = {"norm_gate": 2, "gate": 4}          # the same codes as gemv.fused.KINDS

# (N, K, BM, kind) -> (BN, BK, num_warps, num_stages, split), like skinny.SKINNY_CONFIGS; a key not
# listed keeps the separate gate kernel + skinny GEMM. Session 6, not yet measured on the H200
# (benchmarks/skinny_gemm_bench.py --fold prints the entries to paste here): the plain o_proj
# tile with 8 warps instead of 4. Offline sm_90 compile (per warp and BK step of the K loop, BM 32):
# the plain skinny kernel 142 instructions (cp.async -> smem -> wgmma), the fold with 4 warps
# 603 ("gate") / 810 ("norm_gate": + γ, o², the extra rounding), with 8 warps 471 for
# "norm_gate" (the xᵀ tile's elementwise work is split over twice the threads; 110 registers).
FOLD_SKINNY_CONFIGS: dict[tuple[int, int, int, str], tuple[int, int, int, int, int]] = {
    (4096, 4096, bm, kind): (64, 128, 8, 4, 2) for bm in (16, 32) for kind in KINDS}
# Each program's prologue work and o/z reads are BM x K/split elements whatever BN: more warps cut
# the work per thread, taller tiles with more splits at the same program count (BN 128, split 4)
# cut both.
CANDIDATE_CONFIGS = ((64, 128, 8, 4, 2), (64, 128, 4, 4, 2), (128, 128, 8, 3, 4), (128, 64, 4, 4, 4),
                     (128, 128, 4, 3, 4), (64, 64, 4, 6, 2), (32, 128, 4, 4, 2), (64, 128, 8, 4, 1),
                     (32, 128, 4, 4, 1))


@triton.jit
def _skinny_fold_kernel(o_ptr, z_ptr, g_ptr, w_ptr, y_ptr, ws_ptr, ss_ptr, cnt_ptr, M, N, K, stride_om,
                        stride_zm, stride_wn, stride_ym, split_k, eps,
                        BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, KIND: tl.constexpr,
                        PDL: tl.constexpr = False):
    pdl_wait(PDL)
    pid_n, pid_k, rn, rm, nmask, mmask, k_lo, k_hi = program_tile(M, N, K, split_k, BM, BN, BK)
    rk = tl.arange(0, BK)
    DT = w_ptr.dtype.element_ty
    acc = tl.zeros((BN, BM), tl.float32)
    ss = tl.zeros((BK, BM), tl.float32)       # squares summed elementwise, reduced once at the end
    for k0 in range(k_lo, k_hi, BK):
        kk = k0 + rk
        kmask = kk < K
        w = tl.load(w_ptr + rn[:, None].to(tl.int64) * stride_wn + kk[None, :],
                    mask=nmask[:, None] & kmask[None, :], other=0.0)
        xmask = mmask[None, :] & kmask[:, None]
        o = tl.load(o_ptr + rm[None, :] * stride_om + kk[:, None], mask=xmask, other=0.0).to(tl.float32)
        z = tl.load(z_ptr + rm[None, :] * stride_zm + kk[:, None], mask=xmask, other=0.0).to(tl.float32)
        s = tl.sigmoid(z).to(DT).to(tl.float32)
        if KIND == 2:                               # o_norm(o) * sigmoid(z), r applied at the end
            o = o.to(DT).to(tl.float32)
            ss += o * o
            gamma = tl.load(g_ptr + kk, mask=kmask, other=0.0).to(tl.float32)
            xt = (o * gamma[:, None] * s).to(DT)
        else:                                       # o * sigmoid(g)
            xt = (o * s).to(DT)
        acc = tl.dot(w, xt, acc)
    store_split_k(acc, y_ptr, ws_ptr, cnt_ptr, pid_n, pid_k, split_k, rm, rn, nmask[:, None] & mmask[None, :],
                  M, N, stride_ym, 1, tl.sum(ss, 0), ss_ptr, 1.0 / K, eps, KIND == 2)


def fold_config(kind: str, m: int, w: torch.Tensor) -> tuple[int, int, int, int, int] | None:
    """The block shape when o_proj w after `kind` on m rows should run folded here (16-bit
    weights, 2 <= m <= 64, the shape listed in FOLD_SKINNY_CONFIGS), else None."""
    if not 2 <= m <= 64 or w.dtype not in (torch.bfloat16, torch.float16) or w.stride(-1) != 1:
        return None
    return FOLD_SKINNY_CONFIGS.get((w.shape[0], w.shape[1], block_m(m), kind))


def skinny_fold_linear(kind: str, w: torch.Tensor, o: torch.Tensor, x2: torch.Tensor,
                       gamma: torch.Tensor | None = None, *, eps: float = 0.0,
                       config: tuple[int, int, int, int, int]) -> torch.Tensor:
    """o [M, K] (1 <= M <= 64; any float dtype, unit last stride), x2 = z / o_gate [M, K] (unit
    last stride, any row stride), gamma [K] for "norm_gate"; w [N, K] -> y [M, N] in w's dtype."""
    M, K = o.shape
    N = w.shape[0]
    assert kind in KINDS and w.shape[1] == K and x2.shape == (M, K) and 1 <= M <= 64
    assert o.stride(1) == 1 and x2.stride(1) == 1 and w.stride(1) == 1
    assert kind == "gate" or (gamma is not None and gamma.shape == (K,) and gamma.stride(0) == 1)
    bn, bk, warps, stages, split = config
    split = max(1, min(split, triton.cdiv(K, bk)))
    bm = block_m(M)
    grid = (triton.cdiv(N, bn), split)
    y = torch.empty(M, N, device=w.device, dtype=w.dtype)
    ws = torch.empty(split if split > 1 else 1, M, N, device=w.device, dtype=torch.float32)
    ss = torch.empty(grid[0] * split if kind == "norm_gate" and split > 1 else 1, bm, device=w.device,
                     dtype=torch.float32)
    cnt = split_counters(w.device, grid[0])
    _skinny_fold_kernel[grid](o, x2, gamma if gamma is not None else o, w, y, ws, ss, cnt, M, N, K,
                              o.stride(0), x2.stride(0), w.stride(0), y.stride(0), split, float(eps),
                              BM=bm, BN=bn, BK=bk, KIND=KINDS[kind], num_warps=warps, num_stages=stages,
                              **launch_args(w.device))
    return y

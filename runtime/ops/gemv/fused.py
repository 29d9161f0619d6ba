"""Batch-1 bf16 GEMV with the small op before it folded into its prologue (our Triton kernel).

At one row a decode step is ~420 kernels; the weight-streaming GEMVs are near bandwidth and much
of the rest is launch-bound 2-3 µs kernels that each produce the next GEMV's input: residual add +
RMSNorm, silu(gate)·up, o·sigmoid(o_gate), o_norm(o)·sigmoid(z). Our GEMV (gemv/triton.py) has no
split over K: every program streams its BN weight rows over the whole K, so it sees all of x and
can build x's tile from those ops' inputs while the weights stream, saving the kernel (and its
output round trip) at the cost of re-reading the inputs from L2 in every program. No library has
these fusions, hence hand-written. Prologues (`kind`):

- "norm":      y = r · W·(γ ⊙ x), x = h (+ round(δ·scale) when δ is given), r = rsqrt(mean(x²)+ε)
               over the whole K in fp32; program 0 writes the updated residual x (the next layer's
               h). Differs from rms_norm-then-linear only by rounding (the normalised x is not
               rounded to bf16 before the dot product; r is applied to the fp32 sum).
- "norm_gate": y = r · W·(γ ⊙ round(o) ⊙ round(sigmoid(z))), r from round(o): the lightning
               layer's o_norm(o)·sigmoid(z) before o_proj (same rounding caveat as "norm").
- "glu":       y = W·round(round(silu(g))·u) for gu = [g | u]: the MLP's silu·mul before down_proj,
               with exactly the rounding of the silu_mul kernel.
- "gate":      y = W·round(o·round(sigmoid(g))): the sparse layer's o·sigmoid(o_gate) before
               o_proj, exactly like the sigmoid_gate kernel.
`out_scale` multiplies y before the store (lm_head's 1/logit_divisor); y's dtype is the output
buffer's (fp32 logits straight from the lm_head GEMV).

Which (N, K, kind) use the fold, and with which block shape, is FOLD_CONFIGS below (measured with
benchmarks/gemv_fold_bench.py; an entry missing = that projection keeps the separate kernel).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from salactl.runtime.ops.pdl import launch_args, pdl_wait

KINDS = {"norm": 1, "norm_gate": 2, "glu": 3, "gate": 4}

# (N, K, kind) -> (BN rows per program, BK, num_warps, num_stages); a key not listed keeps the
# separate kernels. Re-set from benchmarks/gemv_fold_bench.py: the block shape from its
# "FOLD_CONFIGS from the isolated sweep" line; keep a group only if its "without <group>" step
# variant is slower than "committed".
FOLD_CONFIGS: dict[tuple[int, int, str], tuple[int, int, int, int]] = {
    # Only these two folds beat the separate kernels in the b1 4K step; the norm folds into the wide
    # q/k/v and gate/up GEMVs and the silu·mul fold into down lost, since every program re-reads the
    # fold's inputs (BENCHMARKS.md, GPU engine session 3).
    (4096, 4096, "norm_gate"): (8, 512, 4, 4),  # lightning o_proj after o_norm · sigmoid(z)
    (4096, 4096, "gate"): (4, 1024, 4, 4),      # sparse o_proj after o · sigmoid(o_gate)
}
CANDIDATE_CONFIGS = ((4, 1024, 4, 4), (8, 512, 4, 4), (16, 512, 8, 3), (32, 256, 8, 3), (64, 128, 8, 3))


@triton.jit(do_not_specialize=["N"])       # N only masks rows: one compile for all row counts
def _fold_gemv_kernel(x_ptr, x2_ptr, g_ptr, w_ptr, y_ptr, hout_ptr, N, K, stride_wn, scale, eps,
                      out_scale, BN: tl.constexpr, BK: tl.constexpr, KIND: tl.constexpr,
                      HAS_DELTA: tl.constexpr, PDL: tl.constexpr = False):
    pdl_wait(PDL)
    pid = tl.program_id(0)
    rn = pid * BN + tl.arange(0, BN)
    rk = tl.arange(0, BK)
    nmask = rn < N
    DT = w_ptr.dtype.element_ty
    acc = tl.zeros((BN, BK), tl.float32)
    ss = tl.zeros((BK,), tl.float32)
    for k0 in range(0, K, BK):
        kk = k0 + rk
        kmask = kk < K
        w = tl.load(w_ptr + rn[:, None].to(tl.int64) * stride_wn + kk[None, :],
                    mask=nmask[:, None] & kmask[None, :], other=0.0)
        x = tl.load(x_ptr + kk, mask=kmask, other=0.0).to(tl.float32)
        if KIND == 1:                                   # residual add + RMSNorm
            if HAS_DELTA:
                d = tl.load(x2_ptr + kk, mask=kmask, other=0.0).to(tl.float32)
                x = (x + (d * scale).to(DT).to(tl.float32)).to(DT).to(tl.float32)
                tl.store(hout_ptr + kk, x.to(DT), mask=kk + pid * K < K)   # program 0 only
            ss += x * x
            x = x * tl.load(g_ptr + kk, mask=kmask, other=0.0).to(tl.float32)
        elif KIND == 2:                                 # o_norm(o) * sigmoid(z)
            x = x.to(DT).to(tl.float32)
            ss += x * x
            z = tl.load(x2_ptr + kk, mask=kmask, other=0.0).to(tl.float32)
            x = x * tl.load(g_ptr + kk, mask=kmask, other=0.0).to(tl.float32)
            x = x * tl.sigmoid(z).to(DT).to(tl.float32)
        elif KIND == 3:                                 # silu(gate) * up, gu = [gate | up]
            u = tl.load(x_ptr + K + kk, mask=kmask, other=0.0).to(tl.float32)
            x = ((x * tl.sigmoid(x)).to(DT).to(tl.float32) * u).to(DT).to(tl.float32)
        else:                                           # o * sigmoid(g)
            g = tl.load(x2_ptr + kk, mask=kmask, other=0.0).to(tl.float32)
            x = (x * tl.sigmoid(g).to(DT).to(tl.float32)).to(DT).to(tl.float32)
        acc += w.to(tl.float32) * x[None, :]
    y = tl.sum(acc, 1) * out_scale
    if KIND <= 2:
        y = y * tl.rsqrt(tl.sum(ss, 0) / K + eps)
    tl.store(y_ptr + rn, y.to(y_ptr.dtype.element_ty), mask=nmask)


def config_for(n: int, k: int, kind: str) -> tuple[int, int, int, int] | None:
    return FOLD_CONFIGS.get((n, k, kind))


def fold_gemv(kind: str, w: torch.Tensor, x: torch.Tensor, x2: torch.Tensor | None = None,
              gamma: torch.Tensor | None = None, *, scale: float = 1.0, eps: float = 0.0,
              out_scale: float = 1.0, out_dtype: torch.dtype | None = None,
              config: tuple[int, int, int, int] | None = None):
    """One row. w [N, K] (unit last stride). x: h / o / gu ([1, K], [1, 2K] for "glu"); x2: δ
    (optional) / z / o_gate ([1, K]); gamma [K] for the norms. Returns y [1, N] (out_dtype, default
    w's dtype) and, for "norm", also the updated residual [1, K] (h itself when δ is None)."""
    N, K = w.shape
    assert w.stride(1) == 1 and x.shape[0] == 1 and x.stride(-1) == 1
    assert x.shape[-1] == (2 * K if kind == "glu" else K)
    bn, bk, warps, stages = config or config_for(N, K, kind) or CANDIDATE_CONFIGS[0]
    y = torch.empty(1, N, device=w.device, dtype=out_dtype or w.dtype)
    has_delta = kind == "norm" and x2 is not None
    hout = torch.empty(1, K, device=w.device, dtype=w.dtype) if has_delta else x
    _fold_gemv_kernel[(triton.cdiv(N, bn),)](
        x, x2 if x2 is not None else x, gamma if gamma is not None else x, w, y, hout, N, K,
        w.stride(0), float(scale), float(eps), float(out_scale), BN=bn, BK=bk, KIND=KINDS[kind],
        HAS_DELTA=has_delta, num_warps=warps, num_stages=stages, **launch_args(w.device))
    return (y, hout) if kind == "norm" else y

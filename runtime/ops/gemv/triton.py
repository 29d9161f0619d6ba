"""Batch-1 bf16 GEMV y = W·x for the decode step (our Triton kernel).

Hand-written because cuBLAS picks split-K GEMMs for the 4096-wide decode projections at one
row (measured on the H200: o_proj 4096x4096 at 57% of copy bandwidth plus a separate split-K
reduce kernel). Here each program streams BN full weight rows (no split over K, so no reduction
kernel) with an fp32 accumulator [BN, BK] and sums it once at the end. Floor: N·K·2 bytes of
weights; 4096x4096 = 33.6 MB = 8.0 µs at 4.2 TB/s. Which shapes use it (`GEMV_SHAPES`) and
with which block shape (`GEMV_CONFIGS`, else `DEFAULT_CONFIG`) come from measurements
(benchmarks/quant_engine_bench.py --only gemv; BENCHMARKS.md).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from salactl.runtime.ops.gemv import skinny
from salactl.runtime.ops.pdl import launch_args, pdl_wait

# (BN rows per program, BK, num_warps, num_stages) per (N, K) weight shape routed to this kernel at
# batch 1; other shapes use cuBLAS through F.linear. Measured on one H200 (commit 59939ab, graph over
# > 256 MB of weight copies): o_proj 4096x4096 10.8 vs cuBLAS 13.4 us, the sparse layers' fused
# q/k/v/o_gate 8704x4096 20.1 vs 24.7 us, down 4096x16384 35.6 vs 37.1 us; the 16384- and
# 32768-row fused projections were within 2% of cuBLAS and stay there.
GEMV_CONFIGS: dict[tuple[int, int], tuple[int, int, int, int]] = {
    (4096, 4096): (4, 1024, 4, 4), (8704, 4096): (32, 256, 8, 3), (4096, 16384): (4, 1024, 4, 4)}
GEMV_SHAPES: set[tuple[int, int]] = set(GEMV_CONFIGS)
DEFAULT_CONFIG = (16, 512, 8, 3)
CANDIDATE_CONFIGS = ((8, 512, 4, 4), (16, 256, 4, 4), (16, 512, 8, 3), (32, 256, 8, 3), (4, 1024, 4, 4),
                     (8, 1024, 8, 3))


@triton.jit
def _gemv_kernel(x_ptr, w_ptr, y_ptr, N, K, stride_wn, BN: tl.constexpr, BK: tl.constexpr, PDL: tl.constexpr = False):
    pdl_wait(PDL)
    rn = tl.program_id(0) * BN + tl.arange(0, BN)
    rk = tl.arange(0, BK)
    nmask = rn < N
    acc = tl.zeros((BN, BK), tl.float32)
    for k0 in range(0, K, BK):
        kmask = k0 + rk < K
        w = tl.load(w_ptr + rn[:, None].to(tl.int64) * stride_wn + (k0 + rk)[None, :],
                    mask=nmask[:, None] & kmask[None, :], other=0.0)
        x = tl.load(x_ptr + k0 + rk, mask=kmask, other=0.0)
        acc += w.to(tl.float32) * x.to(tl.float32)[None, :]
    tl.store(y_ptr + rn, tl.sum(acc, 1).to(y_ptr.dtype.element_ty), mask=nmask)


def gemv(x: torch.Tensor, w: torch.Tensor, config: tuple[int, int, int, int] | None = None) -> torch.Tensor:
    """x [1, K], w [N, K] (unit last stride) -> [1, N] in x's dtype."""
    N, K = w.shape
    assert x.shape == (1, K) and w.stride(1) == 1
    bn, bk, warps, stages = config or GEMV_CONFIGS.get((N, K), DEFAULT_CONFIG)
    x = x.contiguous()
    y = torch.empty(1, N, device=x.device, dtype=x.dtype)
    _gemv_kernel[(triton.cdiv(N, bn),)](x, w, y, N, K, w.stride(0), BN=bn, BK=bk, num_warps=warps,
                                        num_stages=stages, **launch_args(x.device))
    return y


def linear(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """F.linear(x, w), through the GEMV for one row when (N, K) is in GEMV_SHAPES and through the
    skinny GEMM (skinny.py) for 2-64 rows where it measured faster than cuBLAS."""
    if x.shape[0] == 1 and tuple(w.shape) in GEMV_SHAPES and x.dim() == 2:
        return gemv(x, w)
    cfg = skinny.routed(x, w)
    if cfg is not None and x.stride(-1) == 1 and w.stride(-1) == 1:
        return skinny.skinny_linear(x, w, cfg)
    return torch.nn.functional.linear(x, w)

"""The runtime's W4A16 linear: y = x · dequant(W)ᵀ with symmetric 4-bit GPTQ weights in the
tensor-core register layout (layout.py `pack_tc`).

Why hand-written: on an H200, torch's `_weight_int4pack_mm` was 1.74x faster than bf16 at batch 1
but slower from batch 8, and gemlite 1.3-1.55x at batch 1 and slower from batch 8.

`w4a16_linear` dispatches by row count: below DEQUANT_MIN_ROWS the register-operand tensor-core
kernel (triton_tc.py; tile, split, unroll and stages from tc_config.py's `default_tc_config`); above,
one dequantization pass to the bf16/fp16 weight and cuBLAS (`F.linear`, the bf16 path's own GEMM),
because for prefill shapes cuBLAS on the dequantized weight beats a custom GEMM (BENCHMARKS.md).
`w4a16_glu` is the MLP's gate/up projection with silu·mul, in the GEMM's epilogue where it can be.
Triton is imported lazily inside the call, so CPU-only installs can import this module.
"""

from __future__ import annotations

import torch

from salactl.runtime.ops.device_props import sm_count

# From this many rows on, dequantize once and call cuBLAS (see the module docstring).
DEQUANT_MIN_ROWS = 512


def w4a16_linear(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor,
                 group_size: int) -> torch.Tensor:
    """x [M, K] (bf16/fp16) · Wᵀ -> [M, N] in x's dtype; qweight = `pack_tc(q)`, scales fp16
    [groups, N], group_size -1 for one group over K."""
    from salactl.runtime.ops.w4a16.triton_tc import w4a16_tc, w4a16_tc_dequantize

    if x.shape[0] >= DEQUANT_MIN_ROWS:
        return torch.nn.functional.linear(x, w4a16_tc_dequantize(qweight, scales, group_size, x.dtype))
    return w4a16_tc(x, qweight, scales, group_size, sms=sm_count(x.device))


def w4a16_glu(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor, group_size: int) -> torch.Tensor:
    """silu(x·gateᵀ)·(x·upᵀ) [M, N/2] for a W4A16 [gate | up] weight (N rows in all), with the
    rounding of `w4a16_linear` followed by the silu_mul kernel. Below DEQUANT_MIN_ROWS, when the
    dispatch's config allows it (tc_config.glu_epilogue_ok), the GEMM stores silu(gate)·up itself:
    one kernel and one [M, N/2] store instead of two kernels and the [M, N] round trip."""
    from salactl.runtime.ops.fused.triton import silu_mul
    from salactl.runtime.ops.w4a16.layout import TC_ROWS
    from salactl.runtime.ops.w4a16.tc_config import default_tc_config, glu_epilogue_ok
    from salactl.runtime.ops.w4a16.triton_tc import w4a16_tc

    M, K = x.shape
    N = qweight.shape[1] * TC_ROWS
    if M < DEQUANT_MIN_ROWS:
        cfg = default_tc_config(M, N, K, sm_count(x.device))
        if glu_epilogue_ok(cfg, N, K, group_size):
            return w4a16_tc(x, qweight, scales, group_size, cfg, glu=True)
    return silu_mul(w4a16_linear(x, qweight, scales, group_size))

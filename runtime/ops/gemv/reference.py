"""Plain-PyTorch references of the folded GEMVs (gemv/fused.py): the reference layers' op sequence
(runtime/ops/fused/reference.py, then the linear), with every rounding to the activation dtype."""

from __future__ import annotations

import torch.nn.functional as F

from salactl.runtime.ops.fused import reference as R


def fold_gemv(kind: str, w, x, x2=None, gamma=None, *, scale: float = 1.0, eps: float = 0.0,
              out_scale: float = 1.0, out_dtype=None):
    """Same arguments and results as gemv.fused.fold_gemv (any number of rows)."""
    hout = None
    if kind == "norm":
        hout, a = R.add_rmsnorm(x, x2, scale, gamma, eps)
    elif kind == "norm_gate":
        a = R.rmsnorm_gate(x.to(w.dtype), gamma, x2, eps)
    elif kind == "glu":
        a = R.silu_mul(x)
    elif kind == "gate":
        a = R.sigmoid_gate(x, x2)
    else:
        raise ValueError(kind)
    if out_scale != 1.0:
        a = a * out_scale
    y = F.linear(a.float(), w.float()).to(out_dtype or w.dtype)     # fp32 accumulation, like cuBLAS
    return (y, hout) if kind == "norm" else y

"""GPTQ solver (Frantar et al.), our own implementation of reference/quantization.md §1.

Hand-written because the maintained libraries only accept Hugging Face registry models and the
algorithm is small: fp32 Hessian running mean, dead columns, damping (raised by 0.01 until the
Cholesky factorizations succeed, reported), lazy 128-column blocks, symmetric group quantizer,
optional act-order with *static groups* (group scales from the original columns, so g_idx stays
k // group and the checkpoint is desc_act=false), optional clip search of each group's scale weighted
by the Hessian's diagonal (quantizer.clipped_group_scale).

Rows are independent given the Hessian, so linears that share an input (q/k/v/gates, gate/up)
are solved as one row-concatenated matrix over one prepared Hessian.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from salactl.errors import QuantizationError
from salactl.quant.packing import default_g_idx
from salactl.quant.quantizer import (QuantizedWeight, QuantSpec, clipped_group_scale, dequantize_codes, group_scale,
                                     quantize_column)

DAMP_STEP = 0.01


class Hessian:
    """H = 2/n · Σ x xᵀ over n calibration tokens (fp32 running mean, as GPTQ's add_batch)."""

    def __init__(self, dim: int, device):
        self.h = torch.zeros(dim, dim, device=device, dtype=torch.float32)
        self.n = 0
        self.act_dtype: torch.dtype | None = None      # the dtype of the activations added

    @torch.no_grad()
    def add(self, x: torch.Tensor) -> None:
        x = x.reshape(-1, x.shape[-1])
        t = x.shape[0]
        if t == 0:
            return
        self.act_dtype = x.dtype
        self.h *= self.n / (self.n + t)
        self.n += t
        xf = x.float()
        # bf16/fp16 inputs are exact in TF32 (the 2/n scale goes in alpha, not into the inputs), so
        # the tensor-core path loses nothing here.
        prev = torch.backends.cuda.matmul.allow_tf32
        torch.backends.cuda.matmul.allow_tf32 = x.dtype in (torch.bfloat16, torch.float16)
        try:
            self.h.addmm_(xf.t(), xf, alpha=2.0 / self.n)
        finally:
            torch.backends.cuda.matmul.allow_tf32 = prev


@dataclass
class PreparedHessian:
    raw: torch.Tensor            # undamped H (original column order), for error metrics
    u: torch.Tensor              # upper Cholesky factor of the damped inverse (permuted order)
    perm: torch.Tensor | None    # act-order permutation (None: natural order)
    dead: torch.Tensor           # bool [K]: inputs that were always zero
    damp: float                  # the damping fraction that worked


def overflow_error(name: str, act_dtype: torch.dtype | None) -> QuantizationError:
    """A NaN/Inf Hessian: float32 calibration forwards are the fix only where they ran in 16 bits."""
    if act_dtype in (torch.float16, torch.bfloat16):
        fix = (f"its calibration activations overflowed in {str(act_dtype).removeprefix('torch.')}; "
               "quantize in float32 (--dtype float32), or check the checkpoint's weights")
    else:       # float32 forwards: nothing to widen, the weights themselves give such activations
        ran = "" if act_dtype is None else f"{str(act_dtype).removeprefix('torch.')} "
        fix = (f"its {ran}calibration activations or their float32 products overflowed: the checkpoint's "
               "weights drive its activations out of range; check the checkpoint")
    return QuantizationError(f"the Hessian of {name} has NaN/Inf: {fix}")


def prepare_hessian(h: torch.Tensor, damp: float, act_order: bool, name: str,
                    act_dtype: torch.dtype | None = None) -> PreparedHessian:
    """act_dtype: what the activations accumulated into `h` were in (None: float32 or not known)."""
    if not bool(torch.isfinite(h).all()):
        raise overflow_error(name, act_dtype)
    raw = h
    h = h.clone()
    diag = torch.diagonal(h)
    dead = diag == 0
    h[dead, dead] = 1.0
    perm = torch.argsort(torch.diagonal(h), descending=True) if act_order else None
    if perm is not None:
        h = h[perm][:, perm]
    mean_diag = float(torch.diagonal(h).mean())
    idx = torch.arange(h.shape[0], device=h.device)
    d = damp
    while d < 1.0 + 1e-9:
        hd = h.clone()
        hd[idx, idx] += d * mean_diag
        lower, info = torch.linalg.cholesky_ex(hd)
        if int(info) == 0:
            upper, info = torch.linalg.cholesky_ex(torch.cholesky_inverse(lower), upper=True)
            if int(info) == 0 and bool(torch.isfinite(upper).all()):
                return PreparedHessian(raw, upper, perm, dead, d)
        d = round(d + DAMP_STEP, 6)
    raise QuantizationError(f"the Hessian of {name} is not positive definite even with damping 1.0; "
                            "its calibration inputs are degenerate: use more or different calibration text")


@torch.no_grad()
def gptq_quantize(w: torch.Tensor, prep: PreparedHessian, spec: QuantSpec, blocksize: int = 128,
                  clip_search: bool = False) -> QuantizedWeight:
    """w [N, K] -> QuantizedWeight minimizing ‖(W − Q)X‖² column by column with error feedback.
    clip_search: each group's scale by clipped_group_scale (else min-max)."""
    W = w.float().clone()
    N, K = W.shape
    g = spec.group_of(K)
    W[:, prep.dead] = 0
    h_diag = torch.diagonal(prep.raw).float()        # original column order

    def scale_of(cols: torch.Tensor, k0: int) -> torch.Tensor:
        """The scale of the group of original columns k0.. whose current values are `cols`."""
        if not clip_search:
            return group_scale(cols, spec)
        return clipped_group_scale(cols, spec, h_diag[k0:k0 + cols.shape[1]])

    static = None
    if prep.perm is not None:
        # static groups: every group's scale from the original columns, in original order
        static = torch.stack([scale_of(W[:, g0:g0 + g], g0) for g0 in range(0, K, g)])
        W = W[:, prep.perm]
    U = prep.u
    codes = torch.empty(N, K, device=W.device, dtype=torch.uint8)
    Q = torch.empty_like(W)
    scales = torch.empty(-(-K // g), N, device=W.device, dtype=torch.float32)
    group_of_col = (prep.perm if prep.perm is not None else torch.arange(K, device=W.device)) // g
    scale = None
    for i1 in range(0, K, blocksize):
        i2 = min(i1 + blocksize, K)
        W1 = W[:, i1:i2].clone()
        Err1 = torch.empty_like(W1)
        U1 = U[i1:i2, i1:i2]
        col_groups = group_of_col[i1:i2].tolist() if static is not None else None
        for i in range(i2 - i1):
            col = i1 + i
            if static is not None:
                scale = static[col_groups[i]]
            elif col % g == 0:
                if i + g <= i2 - i1:
                    src = W1[:, i:i + g]
                else:   # the group runs past this lazy block: its later columns still lack this block's updates
                    ahead = W[:, i2:col + g] - Err1[:, :i] @ U[i1:i1 + i, i2:col + g]
                    src = torch.cat([W1[:, i:], ahead], 1)
                scale = scale_of(src, col)          # no act-order: current order = original
                scales[col // g] = scale
            wc = W1[:, i]
            q = quantize_column(wc, scale, spec)
            dq = dequantize_codes(q, scale, spec)
            codes[:, col] = q.to(torch.uint8)
            Q[:, col] = dq
            err = (wc - dq) / U1[i, i]
            W1[:, i:] -= err[:, None] * U1[i, i:][None, :]
            Err1[:, i] = err
        W[:, i2:] -= Err1 @ U[i1:i2, i2:]
    if prep.perm is not None:
        inv = torch.argsort(prep.perm)
        Q, codes = Q[:, inv], codes[:, inv]
        scales = static
    return QuantizedWeight(codes, scales.to(torch.float16), default_g_idx(K, spec.group_size, W.device), Q)

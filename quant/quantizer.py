"""Symmetric per-group integer quantizer shared by GPTQ and RTN (reference/quantization.md §1).

Per output row and group: xmax = max(|min(w, 0)|, max(w, 0)) (1 when the group is all zeros),
scale = 2·xmax / (2^b - 1), zero = 2^(b-1); q = clamp(round(w/scale) + zero, 0, 2^b - 1).
Scales are rounded *before* q is computed to the values the checkpoint stores (fp16), so the
dequantized weight the solver sees is the one a loader rebuilds from them. A loader keeps the scales
in its own dtype: vLLM/SGLang's gptq_marlin in the served dtype (params_dtype), our CPU layouts in
bf16. For a checkpoint that may be served in bf16 (`bf16_exact_scales`: stored in bf16 or float32,
sequential.solver_spec) the scales are therefore rounded to values exact in both bf16 and fp16,
which every loader holds unchanged.
"""

from __future__ import annotations

import math

from dataclasses import dataclass

import torch

from salactl.errors import QuantizationError

SUPPORTED_GROUP_SIZES = (-1, 32, 64, 128)
# clip search: the group's max-abs shrunk by 1-20% in 1% steps (the GPTQ reference quantizer's optional mse
# search shrinks up to 80% under a |err|^2.4 norm; ours is the Hessian-diagonal-weighted squared error)
CLIP_SHRINKS = tuple(1 - i / 100 for i in range(1, 21))
_FP16_MIN_SUBNORMAL = 2.0 ** -24
_FP16_MAX = torch.finfo(torch.float16).max


@dataclass(frozen=True)
class QuantSpec:
    bits: int = 4
    group_size: int = 128
    bf16_exact_scales: bool = False     # scales exact in bf16 too (see the module docstring)

    def __post_init__(self) -> None:
        if self.bits not in (4, 8):
            raise QuantizationError(f"bits (--bits) {self.bits} is not supported; use 4 or 8 (symmetric, "
                                    "the formats Marlin loads)")
        if self.group_size not in SUPPORTED_GROUP_SIZES:
            raise QuantizationError(f"group_size (--group-size) {self.group_size} is not supported; use one of "
                                    f"{', '.join(map(str, SUPPORTED_GROUP_SIZES))}")

    @property
    def maxq(self) -> int:
        return 2 ** self.bits - 1

    @property
    def zero(self) -> int:
        return 2 ** (self.bits - 1)

    def group_of(self, in_features: int) -> int:
        return in_features if self.group_size == -1 else self.group_size


def group_scale(w: torch.Tensor, spec: QuantSpec) -> torch.Tensor:
    """w [N, g] fp32 -> per-row scale [N] fp32, exactly representable in fp16 (and, with
    spec.bf16_exact_scales, in bf16)."""
    xmax = torch.maximum(w.amax(dim=1).clamp_min(0), (-w.amin(dim=1)).clamp_min(0))
    xmax = torch.where(xmax == 0, torch.ones_like(xmax), xmax)
    exact = 2 * xmax / spec.maxq
    scale = exact.to(torch.float16).float()
    if spec.bf16_exact_scales:
        bf16 = exact.to(torch.bfloat16).float()
        fp16_exact = bf16.to(torch.float16).float() == bf16
        # not fp16-exact: below 2^-17, where bf16 is finer than fp16's subnormal grid (the fp16 value
        # there, of at most 7 significant bits, is exact in bf16), or past fp16's range (then kept:
        # the caller refuses the infinite fp16 scale)
        scale = torch.where(fp16_exact | (bf16 > _FP16_MAX), bf16, scale)
    return scale.clamp_min(_FP16_MIN_SUBNORMAL)


def clipped_group_scale(w: torch.Tensor, spec: QuantSpec, col_weight: torch.Tensor) -> torch.Tensor:
    """group_scale with clipping: per row, among the scales of the max-abs and of the max-abs
    shrunk by CLIP_SHRINKS, the one minimizing Σ_j col_weight_j · (w_j − q(w_j))². With col_weight =
    diag(H) of the group's inputs that is the layer-output error ‖(W − Q)X‖² without its cross
    terms, so a rarely large input column may be clipped and a busy one kept. Ties keep the larger
    scale (plain min-max when nothing is gained)."""
    best = group_scale(w, spec)
    best_err = _weighted_error(w, best, spec, col_weight)
    for shrink in CLIP_SHRINKS:
        scale = group_scale(w * shrink, spec)
        err = _weighted_error(w, scale, spec, col_weight)
        better = err < best_err
        best, best_err = torch.where(better, scale, best), torch.where(better, err, best_err)
    return best


def _weighted_error(w: torch.Tensor, scale: torch.Tensor, spec: QuantSpec, col_weight: torch.Tensor) -> torch.Tensor:
    d = w - dequantize_codes(quantize_column(w, scale[:, None], spec), scale[:, None], spec)
    return (d * d) @ col_weight


def quantize_column(w: torch.Tensor, scale: torch.Tensor, spec: QuantSpec) -> torch.Tensor:
    """Integer codes in [0, maxq] (same shape as w; scale broadcasts)."""
    return torch.clamp(torch.round(w / scale) + spec.zero, 0, spec.maxq)


def dequantize_codes(q: torch.Tensor, scale: torch.Tensor, spec: QuantSpec) -> torch.Tensor:
    return scale * (q - spec.zero)


@dataclass
class QuantizedWeight:
    """One linear's result: codes [N, K] (uint8), scales [groups, N] fp16, g_idx [K] int32, and
    the dequantized weight [N, K] fp32 (what the quantized model computes with)."""

    codes: torch.Tensor
    scales: torch.Tensor
    g_idx: torch.Tensor
    dequantized: torch.Tensor

    def rows(self, start: int, stop: int) -> "QuantizedWeight":
        """The slice of output rows [start, stop) (for jointly solved shared-input linears)."""
        return QuantizedWeight(self.codes[start:stop], self.scales[:, start:stop], self.g_idx,
                               self.dequantized[start:stop])


def output_error(w: torch.Tensor, q: torch.Tensor, h: torch.Tensor) -> float:
    """Relative layer-output error ‖WX − QX‖ / ‖WX‖ from the Hessian H ∝ XXᵀ (scale-free)."""
    d = (w.float() - q.float())
    num = float(((d @ h) * d).sum())
    den = float(((w.float() @ h) * w.float()).sum())
    if not (math.isfinite(num) and math.isfinite(den)):
        return math.nan
    return (max(num, 0.0) / den) ** 0.5 if den > 0 else 0.0

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
    return _scale_of_max_abs(_max_abs(w), spec)


def _max_abs(w: torch.Tensor) -> torch.Tensor:
    return torch.maximum(w.amax(dim=1).clamp_min(0), (-w.amin(dim=1)).clamp_min(0))


def _scale_of_max_abs(xmax: torch.Tensor, spec: QuantSpec) -> torch.Tensor:
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


# candidates scored together: on a GPU up to 64 MiB of fp32 per temporary (fewer launches); on a CPU
# about one candidate at a time, whose temporaries stay in cache (batching them there is slower)
_CLIP_CHUNK_ELEMENTS = {"cuda": 1 << 24, "cpu": 1 << 16}


def clipped_group_scale(w: torch.Tensor, spec: QuantSpec, col_weight: torch.Tensor) -> torch.Tensor:
    """group_scale with clipping: per row, among the scales of the max-abs and of the max-abs
    shrunk by CLIP_SHRINKS, the one minimizing Σ_j col_weight_j · (w_j − q(w_j))². With col_weight =
    diag(H) of the group's inputs that is the layer-output error ‖(W − Q)X‖² without its cross
    terms, so a rarely large input column may be clipped and a busy one kept. Ties keep the larger
    scale (plain min-max when nothing is gained)."""
    xmax = _max_abs(w)
    # max|w·p| is max|w|·p rounded (rounding is monotonic), so each candidate equals group_scale(w * p)
    # without a scaled copy of w; the candidates are then scored together, a few launches per chunk
    candidates = _scale_of_max_abs(torch.stack([xmax] + [xmax * p for p in CLIP_SHRINKS]), spec)   # [S, N]
    per_chunk = max(1, _CLIP_CHUNK_ELEMENTS.get(w.device.type, 1 << 16) // max(1, w.numel()))
    errors = torch.cat([_weighted_error(w, c, spec, col_weight) for c in candidates.split(per_chunk)])
    best = errors.argmin(dim=0, keepdim=True)        # the first minimum: ties keep the larger scale
    return candidates.gather(0, best)[0]


def _weighted_error(w: torch.Tensor, scales: torch.Tensor, spec: QuantSpec, col_weight: torch.Tensor) -> torch.Tensor:
    """w [N, g], scales [S, N] -> [S, N]: each candidate's Σ_j col_weight_j · (w_j − q(w_j))² per row."""
    s = scales[:, :, None]
    d = w - dequantize_codes(quantize_column(w, s, spec), s, spec)
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

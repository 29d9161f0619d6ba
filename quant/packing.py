"""GPTQ v1 tensor packing (reference/quantization.md §2), written by hand because the layout is
four fixed int32 bit-packings and every library that has it wants a whole HF model around it.

For a linear with in_features K, out_features N, `bits` b (4 or 8), v = 32 // b values per word:
- qweight int32 [K/v, N]: bits b·j .. b·j+b-1 of word (r, n) hold q[v·r + j, n] (j = 0 in the
  least-significant bits); packed along K.
- qzeros int32 [groups, N/v]: bits b·j.. of word (g, c) hold z[g, v·c + j] - 1 in v1
  ("gptq") and z as-is in v2 ("gptq_v2"); packed along N.
- scales [groups, N]; g_idx int32 [K] (the group of input channel k).
"""

from __future__ import annotations

import torch

from salactl.errors import QuantizationError

SUPPORTED_BITS = (4, 8)
FORMATS = ("gptq", "gptq_v2")


def values_per_word(bits: int) -> int:
    if bits not in SUPPORTED_BITS:
        raise QuantizationError(f"{bits}-bit GPTQ is not supported; use --bits 4 or 8")
    return 32 // bits


def _to_int32(words: torch.Tensor) -> torch.Tensor:
    """int64 values in [0, 2^32) -> the int32 with the same bit pattern."""
    return torch.where(words >= 2 ** 31, words - 2 ** 32, words).to(torch.int32)


def _pack(values: torch.Tensor, bits: int, dim: int) -> torch.Tensor:
    v = values_per_word(bits)
    if values.shape[dim] % v:
        raise QuantizationError(f"cannot pack {values.shape[dim]} values along dim {dim} into "
                                f"{bits}-bit words: not a multiple of {v}")
    vals = values.to(torch.int64)
    if int(vals.min()) < 0 or int(vals.max()) >= 2 ** bits:
        raise QuantizationError(f"values outside [0, {2 ** bits - 1}] cannot be packed as {bits}-bit")
    vals = vals.movedim(dim, 0)
    vals = vals.reshape(vals.shape[0] // v, v, *vals.shape[1:])
    shifts = (torch.arange(v, device=vals.device, dtype=torch.int64) * bits).view(1, v, *[1] * (vals.dim() - 2))
    words = (vals << shifts).sum(dim=1)
    return _to_int32(words).movedim(0, dim).contiguous()


def _unpack(words: torch.Tensor, bits: int, dim: int) -> torch.Tensor:
    v = values_per_word(bits)
    w = words.to(torch.int32).movedim(dim, 0)
    shifts = (torch.arange(v, device=w.device, dtype=torch.int32) * bits).view(1, v, *[1] * (w.dim() - 1))
    vals = (w.unsqueeze(1) >> shifts) & (2 ** bits - 1)
    vals = vals.reshape(w.shape[0] * v, *w.shape[1:])
    return vals.movedim(0, dim).contiguous()


def pack_qweight(q: torch.Tensor, bits: int) -> torch.Tensor:
    """q: integer values [K, N] in [0, 2^bits) -> qweight int32 [K*bits/32, N]."""
    return _pack(q, bits, dim=0)


def unpack_qweight(qweight: torch.Tensor, bits: int) -> torch.Tensor:
    """qweight int32 [K*bits/32, N] -> int32 values [K, N]."""
    return _unpack(qweight, bits, dim=0)


def pack_qzeros(zeros: torch.Tensor, bits: int, fmt: str = "gptq") -> torch.Tensor:
    """zeros [groups, N] (the true zero points) -> qzeros int32 [groups, N*bits/32]."""
    if fmt not in FORMATS:
        raise QuantizationError(f"unknown checkpoint_format {fmt!r}; valid: {', '.join(FORMATS)}")
    stored = zeros.to(torch.int64) - (1 if fmt == "gptq" else 0)
    return _pack(stored, bits, dim=1)


def unpack_qzeros(qzeros: torch.Tensor, bits: int, fmt: str = "gptq") -> torch.Tensor:
    """qzeros int32 [groups, N*bits/32] -> the true zero points [groups, N] (v1 adds the 1 back,
    wrapping within `bits` like the CUDA loaders do)."""
    if fmt not in FORMATS:
        raise QuantizationError(f"unknown checkpoint_format {fmt!r}; valid: {', '.join(FORMATS)}")
    z = _unpack(qzeros, bits, dim=1)
    return (z + 1) & (2 ** bits - 1) if fmt == "gptq" else z


def symmetric_zero(bits: int) -> int:
    """The fixed zero point of symmetric GPTQ: 2^(bits-1) (8 for 4-bit, 128 for 8-bit)."""
    return 2 ** (bits - 1)


def symmetric_qzeros_word(bits: int, fmt: str = "gptq") -> int:
    """The int32 every qzeros word holds for symmetric quantization (0x77777777 for 4-bit v1)."""
    z = symmetric_zero(bits) - (1 if fmt == "gptq" else 0)
    word = sum(z << (bits * j) for j in range(32 // bits))
    return word - 2 ** 32 if word >= 2 ** 31 else word


def default_g_idx(in_features: int, group_size: int, device=None) -> torch.Tensor:
    g = in_features if group_size == -1 else group_size
    return torch.arange(in_features, device=device, dtype=torch.int32) // g


def num_groups(in_features: int, group_size: int) -> int:
    return 1 if group_size == -1 else -(-in_features // group_size)


def to_gptq_tensors(codes_nk: torch.Tensor, scales: torch.Tensor, g_idx: torch.Tensor,
                    bits: int) -> dict[str, torch.Tensor]:
    """Checkpoint tensors of one symmetric linear from codes [N, K], scales [groups, N], g_idx [K]
    (on any device): qweight, qzeros (v1), fp16 scales, int32 g_idx."""
    groups, n = scales.shape
    zeros = torch.full((groups, n), symmetric_zero(bits), dtype=torch.int64, device=scales.device)
    return {"qweight": pack_qweight(codes_nk.t(), bits),
            "qzeros": pack_qzeros(zeros, bits, "gptq"),
            "scales": scales.to(torch.float16).clone(memory_format=torch.contiguous_format),
            "g_idx": g_idx.to(torch.int32).clone()}

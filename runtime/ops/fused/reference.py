"""The small fused ops of the GPU decode path, written as the exact op sequences of the reference
layers (same bf16 rounding points). The Triton kernels in triton.py must match these."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from salactl.runtime.layers.norm import rms_norm
from salactl.runtime.layers.rope import apply_rope


def add_rmsnorm(h, delta, scale: float, weight, eps: float):
    """DecoderLayer's `h = h + branch * residual_scale` followed by the next RMSNorm."""
    if delta is not None:
        h = h + delta * scale
    return h, rms_norm(h, weight, eps)


def qk_norm_rope(q, k, wq, wk, cos, sin, eps: float):
    """Lightning layer: per-head RMSNorm of q and k, then RoPE (fp32, rounded to the dtype)."""
    return apply_rope(rms_norm(q, wq, eps), cos, sin), apply_rope(rms_norm(k, wk, eps), cos, sin)


def rmsnorm_gate(o, weight, z, eps: float):
    """Lightning layer: o_norm(o) * sigmoid(z)."""
    return rms_norm(o, weight, eps) * torch.sigmoid(z)


def sigmoid_gate(o, g):
    """Sparse layer: o * sigmoid(o_gate(x))."""
    return o * torch.sigmoid(g)


def silu_mul(gate_up):
    """MLP: silu(gate) * up for gate_up = [gate | up] along the last dim."""
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up

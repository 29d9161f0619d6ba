"""`lightning-attn` mixer: Simple GLA with qk-norm, RoPE, o_norm and a sigmoid output gate."""

from __future__ import annotations

import math

import torch
from torch import nn

from salactl.runtime.config import SalaConfig
from salactl.runtime.layers.norm import RMSNorm
from salactl.runtime.layers.rope import apply_rope


def alibi_slopes(n: int) -> list[float]:
    """ALiBi head slopes (Press et al.); for n a power of two, slope_h = 2^(-8(h+1)/n)."""
    def power_of_2(m: int) -> list[float]:
        start = 2 ** (-(2 ** -(math.log2(m) - 3)))
        return [start * start ** i for i in range(m)]

    if math.log2(n).is_integer():
        return power_of_2(n)
    closest = 2 ** math.floor(math.log2(n))
    return power_of_2(closest) + alibi_slopes(2 * closest)[0::2][: n - closest]


class LightningAttention(nn.Module):
    def __init__(self, config: SalaConfig, layer_idx: int):
        super().__init__()
        h, d, hidden = config.lightning_nh, config.lightning_head_dim, config.hidden_size
        self.layer_idx, self.heads, self.head_dim = layer_idx, h, d
        self.scale = config.gla_scale
        self.q_proj = nn.Linear(hidden, h * d, bias=False)
        self.k_proj = nn.Linear(hidden, h * d, bias=False)
        self.v_proj = nn.Linear(hidden, h * d, bias=False)
        self.o_proj = nn.Linear(h * d, hidden, bias=False)
        self.z_proj = nn.Linear(hidden, h * d, bias=False)
        self.q_norm = RMSNorm(d, config.rms_norm_eps)
        self.k_norm = RMSNorm(d, config.rms_norm_eps)
        self.o_norm = RMSNorm(h * d, config.rms_norm_eps)
        self.use_rope = config.lightning_use_rope
        # g_gamma = -slopes: natural-log decay per head, independent of the layer.
        self._neg_slopes = [-s for s in alibi_slopes(h)]
        self._g_gamma: torch.Tensor | None = None

    def g_gamma(self, device) -> torch.Tensor:
        if self._g_gamma is None or self._g_gamma.device != device:
            self._g_gamma = torch.tensor(self._neg_slopes, dtype=torch.float32, device=device)
        return self._g_gamma

    def forward(self, x: torch.Tensor, batch) -> torch.Tensor:
        n = x.shape[0]
        with batch.timer("qkv"):
            q = self.q_norm(self.q_proj(x).view(n, self.heads, self.head_dim))
            k = self.k_norm(self.k_proj(x).view(n, self.heads, self.head_dim))
            v = self.v_proj(x).view(n, self.heads, self.head_dim)
            if self.use_rope:
                q = apply_rope(q, batch.rope_cos, batch.rope_sin)
                k = apply_rope(k, batch.rope_cos, batch.rope_sin)
        with batch.timer("gla"):
            o = batch.backend.linear_attention(self.layer_idx, q, k, v, self.g_gamma(x.device), self.scale, batch)
        with batch.timer("gates"):
            o = self.o_norm(o.to(x.dtype).reshape(n, -1)) * torch.sigmoid(self.z_proj(x))
        with batch.timer("o_proj"):
            return self.o_proj(o)

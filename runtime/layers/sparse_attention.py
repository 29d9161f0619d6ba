"""`minicpm4` mixer: NoPE GQA softmax attention (dense, or InfLLM-V2 sparse past dense_len)
followed by a sigmoid output gate."""

from __future__ import annotations

import torch
from torch import nn

from salactl.runtime.config import SalaConfig


class SparseAttention(nn.Module):
    def __init__(self, config: SalaConfig, layer_idx: int):
        super().__init__()
        hq, hkv, d, hidden = (config.num_attention_heads, config.num_key_value_heads,
                              config.head_dim, config.hidden_size)
        self.layer_idx, self.hq, self.hkv, self.head_dim = layer_idx, hq, hkv, d
        self.q_proj = nn.Linear(hidden, hq * d, bias=False)
        self.k_proj = nn.Linear(hidden, hkv * d, bias=False)
        self.v_proj = nn.Linear(hidden, hkv * d, bias=False)
        self.o_proj = nn.Linear(hq * d, hidden, bias=False)
        self.o_gate = nn.Linear(hidden, hq * d, bias=False)

    def forward(self, x: torch.Tensor, batch) -> torch.Tensor:
        n = x.shape[0]
        with batch.timer("qkv"):
            q = self.q_proj(x).view(n, self.hq, self.head_dim)
            k = self.k_proj(x).view(n, self.hkv, self.head_dim)
            v = self.v_proj(x).view(n, self.hkv, self.head_dim)
        with batch.timer("attention"):
            o = batch.backend.softmax_attention(self.layer_idx, q, k, v, batch)
        with batch.timer("gates"):
            o = o.reshape(n, -1) * torch.sigmoid(self.o_gate(x))
        with batch.timer("o_proj"):
            return self.o_proj(o)

"""MiniCPM-SALA decoder. Module names equal the HF checkpoint's tensor names."""

from __future__ import annotations

import torch
from torch import nn

from salactl.runtime.config import SPARSE, SalaConfig
from salactl.runtime.layers.lightning import LightningAttention
from salactl.runtime.layers.mlp import MLP
from salactl.runtime.layers.norm import RMSNorm
from salactl.runtime.layers.sparse_attention import SparseAttention


class DecoderLayer(nn.Module):
    def __init__(self, config: SalaConfig, layer_idx: int):
        super().__init__()
        mixer = SparseAttention if config.mixer_types[layer_idx] == SPARSE else LightningAttention
        self.self_attn = mixer(config, layer_idx)
        self.mlp = MLP(config.hidden_size, config.intermediate_size)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.residual_scale = config.residual_scale

    def forward(self, h: torch.Tensor, batch) -> torch.Tensor:
        h = h + self.self_attn(self.input_layernorm(h), batch) * self.residual_scale
        return h + self.mlp(self.post_attention_layernorm(h), batch.timer) * self.residual_scale


class SalaDecoder(nn.Module):
    def __init__(self, config: SalaConfig):
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(config, i) for i in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)


class SalaForCausalLM(nn.Module):
    def __init__(self, config: SalaConfig):
        super().__init__()
        self.config = config
        self.model = SalaDecoder(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)

    @property
    def device(self) -> torch.device:
        """Where the parameters live (all on one device)."""
        return self.model.embed_tokens.weight.device

    def hidden_states(self, input_ids: torch.Tensor, batch) -> torch.Tensor:
        h = self.model.embed_tokens(input_ids) * self.config.scale_emb
        for layer in self.model.layers:
            h = layer(h, batch)
        return self.model.norm(h)

    def logits(self, h: torch.Tensor, batch) -> torch.Tensor:
        with batch.timer("lm_head"):
            return self.lm_head(h / self.config.logit_divisor).float()

    def forward(self, input_ids: torch.Tensor, batch, logit_rows: torch.Tensor | None = None) -> torch.Tensor:
        """input_ids [N] (all sequences' new tokens, concatenated); returns fp32 logits for
        `logit_rows` (default: every row)."""
        h = self.hidden_states(input_ids, batch)
        if logit_rows is not None:
            h = h[logit_rows]
        return self.logits(h, batch)

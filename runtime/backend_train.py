"""Batched, differentiable attention backend for training: B equal-length sequences that start at
position 0 with no cache, flattened to [B*T] rows like every other backend's input.

Same math as ReferenceBackend (tests/test_backend_train.py compares them), organised for throughput:
- softmax layers: causal SDPA; rows at or past dense_len get the InfLLM-V2 block mask from the
  reference selection ops, run for all sequences at once by folding the batch into the head axis
  (selection is a hard top-k, so it carries no gradient, as in InfLLM-V2 training);
- lightning layers: the exact parallel form of Simple GLA, o = ((q·scale) kᵀ ⊙ D) v with
  D[h,i,j] = exp(g_h (i-j)) for j <= i, quadratic in T but one batched matmul pair instead of a
  Python loop over chunks. Attention math runs in fp32 with autocast off, as the reference does.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from salactl.runtime.config import SalaConfig
from salactl.runtime.layers.rope import rope_cos_sin
from salactl.runtime.op_timer import NULL_TIMER
from salactl.runtime.ops.selection import compress_keys, num_windows, select_blocks, sparse_token_mask


@dataclass
class TrainBatch:
    """The ForwardBatch fields the layers read, for B sequences of T tokens at positions 0..T-1."""

    batch_size: int
    seq_len: int
    positions: torch.Tensor      # [T]
    backend: object
    rope_cos: torch.Tensor       # [B*T, d]
    rope_sin: torch.Tensor
    timer: object = NULL_TIMER

    @classmethod
    def build(cls, config: SalaConfig, batch_size: int, seq_len: int, backend, device) -> "TrainBatch":
        positions = torch.arange(seq_len, device=device)
        cos, sin = rope_cos_sin(positions, config.lightning_head_dim, config.rope_theta)
        return cls(batch_size, seq_len, positions, backend, cos.repeat(batch_size, 1), sin.repeat(batch_size, 1))


class TrainingBackend:
    name = "train"

    def __init__(self, config: SalaConfig):
        self.config = config
        self._decay: dict[int, torch.Tensor] = {}
        self._decay_len = -1

    # ---- minicpm4 layers -------------------------------------------------------------------
    @torch.no_grad()
    def token_mask(self, q, k, batch: TrainBatch) -> torch.Tensor | None:
        """bool [B, Hkv, T, T] of the keys each query may attend, or None when all rows are dense."""
        sc = self.config.sparse_config
        B, T = batch.batch_size, batch.seq_len
        first = max(sc.dense_len - 1, 0)          # rows t with t+1 >= dense_len (host-side: no sync)
        if first >= T:
            return None
        pos = batch.positions[first:]
        hq, hkv, d = q.shape[1], k.shape[1], q.shape[2]
        # Fold the batch into the head axis: head b*H + h; GQA groups stay aligned because hq = g*hkv.
        k_heads = k.view(B, T, hkv, d).transpose(0, 1).reshape(T, B * hkv, d)
        q_rows = q.view(B, T, hq, d)[:, first:].transpose(0, 1).reshape(-1, B * hq, d)
        k1 = compress_keys(k_heads, sc, 0, num_windows(T, sc))
        blocks = select_blocks(q_rows, k1, pos, sc, math.ceil(T / sc.block_size))
        sparse = sparse_token_mask(blocks, pos, T, sc.block_size)                 # [B*hkv, n, T]
        allowed = torch.ones(T, T, dtype=torch.bool, device=q.device).tril()
        allowed = allowed.expand(B, hkv, T, T).clone()
        allowed[:, :, first:] = sparse.view(B, hkv, -1, T)
        return allowed

    def softmax_attention(self, layer, q, k, v, batch: TrainBatch):
        B, T = batch.batch_size, batch.seq_len
        hq, hkv, d = q.shape[1], k.shape[1], q.shape[2]
        g = hq // hkv
        allowed = self.token_mask(q, k, batch)
        with torch.autocast(q.device.type, enabled=False):
            qh = q.float().view(B, T, hq, d).transpose(1, 2)
            kh = k.float().view(B, T, hkv, d).transpose(1, 2).repeat_interleave(g, dim=1)
            vh = v.float().view(B, T, hkv, d).transpose(1, 2).repeat_interleave(g, dim=1)
            if allowed is None:
                o = F.scaled_dot_product_attention(qh, kh, vh, is_causal=True)
            else:
                mask = allowed[:, :, None].expand(B, hkv, g, T, T).reshape(B, hq, T, T)
                o = F.scaled_dot_product_attention(qh, kh, vh, attn_mask=mask)
        return o.transpose(1, 2).reshape(B * T, hq, d).to(q.dtype)

    # ---- lightning layers ------------------------------------------------------------------
    def decay_matrix(self, g_gamma: torch.Tensor, T: int) -> torch.Tensor:
        if T != self._decay_len:                  # one length at a time: bounded memory
            self._decay, self._decay_len = {}, T
        key = g_gamma.data_ptr()                  # each layer owns its g_gamma; no device sync
        if key not in self._decay:
            idx = torch.arange(T, device=g_gamma.device, dtype=torch.float32)
            diff = idx[:, None] - idx[None, :]
            decay = torch.exp(g_gamma.float()[:, None, None] * diff.clamp(min=0)) * (diff >= 0)
            self._decay[key] = decay
        return self._decay[key]

    def linear_attention(self, layer, q, k, v, g_gamma, scale, batch: TrainBatch):
        B, T = batch.batch_size, batch.seq_len
        h, dk, dv = q.shape[1], q.shape[2], v.shape[2]
        with torch.autocast(q.device.type, enabled=False):
            qh = q.float().view(B, T, h, dk).transpose(1, 2) * scale
            kh = k.float().view(B, T, h, dk).transpose(1, 2)
            vh = v.float().view(B, T, h, dv).transpose(1, 2)
            att = (qh @ kh.transpose(-1, -2)) * self.decay_matrix(g_gamma, T)
            o = att @ vh
        return o.transpose(1, 2).reshape(B * T, h, dv)

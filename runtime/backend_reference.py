"""Reference attention backend: the plain-PyTorch ops of DESIGN.md §2 over `SequenceCache`s.
A fast backend implements the same two methods; the layers never change."""

from __future__ import annotations

import math

import torch

from salactl.runtime.config import SalaConfig
from salactl.runtime.ops.attention import attention
from salactl.runtime.ops.attention.gathered import selected_attention
from salactl.runtime.ops.gla import gla_chunked, gla_recurrent
from salactl.runtime.ops.selection import select_blocks, sparse_token_mask


class ReferenceBackend:
    name = "reference"

    def __init__(self, config: SalaConfig, gla_chunk: int = 64, attention_op=attention, gather_sparse: bool = True):
        """attention_op: reference.attention's contract (calibration passes ops/attention/sdpa.py's),
        for every row with gather_sparse=False, else for the dense rows (position + 1 < dense_len),
        while sparse rows read only their kept blocks (ops/attention/gathered.py: the same keys)."""
        self.config = config
        self.gla_chunk = gla_chunk
        self.attention_op = attention_op
        self.gather_sparse = gather_sparse

    def _slices(self, batch):
        off = 0
        for i, (seq, n) in enumerate(zip(batch.seqs, batch.q_lens)):
            yield seq, slice(off, off + n)
            off += n

    def softmax_attention(self, layer, q, k, v, batch):
        sc = self.config.sparse_config
        outs = []
        for seq, s in self._slices(batch):
            keys, values = seq.append_kv(layer, k[s], v[s])                  # as stored (FP8 or values)
            qs, pos = q[s], batch.positions[s]
            sparse_rows = (pos + 1) >= sc.dense_len
            if not bool(sparse_rows.any()):
                outs.append(self.attention_op(qs, *seq.dequantized(layer, keys, values), pos))  # causal
                continue
            L = keys.shape[0]
            k1 = seq.compressed_keys(layer, keys)
            blocks = select_blocks(qs[sparse_rows], k1, pos[sparse_rows], sc, math.ceil(L / sc.block_size))
            if not self.gather_sparse:
                allowed = (torch.arange(L, device=q.device)[None, :] <= pos[:, None])
                allowed = allowed[None].expand(self.config.num_key_value_heads, -1, -1).clone()
                allowed[:, sparse_rows] = sparse_token_mask(blocks, pos[sparse_rows], L, sc.block_size)
                outs.append(self.attention_op(qs, *seq.dequantized(layer, keys, values), pos, allowed))
                continue
            o = torch.empty_like(qs)
            dense_rows = ~sparse_rows
            if bool(dense_rows.any()):
                o[dense_rows] = self.attention_op(qs[dense_rows], *seq.dequantized(layer, keys, values),
                                                  pos[dense_rows])
            # sparse rows dequantize only the tokens of their kept blocks
            o[sparse_rows] = selected_attention(qs[sparse_rows], keys, values, pos[sparse_rows], blocks,
                                                sc.block_size, sc.selected_blocks, seq.scales(layer))
            outs.append(o)
        return torch.cat(outs)

    def linear_attention(self, layer, q, k, v, g_gamma, scale, batch):
        outs = []
        for seq, s in self._slices(batch):
            fn = gla_recurrent if s.stop - s.start == 1 else gla_chunked
            kwargs = {} if fn is gla_recurrent else {"chunk": self.gla_chunk}
            o, seq.state[layer] = fn(q[s], k[s], v[s], g_gamma, scale, seq.state[layer], **kwargs)
            outs.append(o)
        return torch.cat(outs)

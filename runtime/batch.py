"""What one forward call needs besides the token ids: the sequences, their new-token counts,
absolute positions, RoPE tables, the attention backend and the op timer."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from salactl.runtime.layers.rope import rope_cos_sin
from salactl.runtime.op_timer import NULL_TIMER


@dataclass
class ForwardBatch:
    seqs: list
    q_lens: list[int]
    positions: torch.Tensor
    backend: object
    rope_cos: torch.Tensor
    rope_sin: torch.Tensor
    timer: object = NULL_TIMER

    @classmethod
    def build(cls, config, seqs, q_lens, backend, device, timer=NULL_TIMER) -> "ForwardBatch":
        positions = torch.cat([torch.arange(s.length, s.length + n, device=device)
                               for s, n in zip(seqs, q_lens)])
        cos, sin = rope_cos_sin(positions, config.lightning_head_dim, config.rope_theta)
        return cls(seqs, list(q_lens), positions, backend, cos, sin, timer)

    def commit(self) -> None:
        for seq, n in zip(self.seqs, self.q_lens):
            seq.length += n

    def last_rows(self) -> torch.Tensor:
        ends = torch.tensor(self.q_lens, device=self.positions.device).cumsum(0) - 1
        return ends

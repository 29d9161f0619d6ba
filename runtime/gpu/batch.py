"""What one forward call of the GPU engine carries besides token ids. The layers read only
`backend`, `timer`, `rope_cos`, `rope_sin` (as with the reference ForwardBatch); the rest is the
GPU backend's metadata. Every tensor here is on the device, so a decode batch built from static
buffers can be captured in a CUDA graph."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from salactl.runtime.layers.rope import rope_cos_sin
from salactl.runtime.op_timer import NULL_TIMER


@dataclass(frozen=True)
class Segment:
    """Prefill rows [row0, row0+n) are tokens [pos0, pos0+n) of the request in `slot`."""
    slot: int
    row0: int
    n: int
    pos0: int


@dataclass
class GPUBatch:
    backend: object
    positions: torch.Tensor       # int64 [n]
    slots: torch.Tensor           # int32 [n], the request slot of each row
    seq_lens: torch.Tensor        # int32 [n], keys visible to each row (position + 1)
    rope_cos: torch.Tensor
    rope_sin: torch.Tensor
    decode: bool                  # one token per request (batched decode kernels)
    sparse: bool = False          # decode: run InfLLM-V2 selection (some row is past dense_len)
    k1_start: torch.Tensor | None = None   # decode+sparse: window completed by each row's token
    k1_count: torch.Tensor | None = None
    segments: list[Segment] = field(default_factory=list)   # prefill
    timer: object = NULL_TIMER

    @classmethod
    def build(cls, config, backend, positions: torch.Tensor, slots: torch.Tensor, decode: bool,
              sparse: bool = False, segments=(), timer=NULL_TIMER) -> "GPUBatch":
        cos, sin = rope_cos_sin(positions, config.lightning_head_dim, config.rope_theta)
        seq_lens = (positions + 1).to(torch.int32)
        k1_start = k1_count = None
        if decode and sparse:
            sc = config.sparse_config
            j = positions - (sc.kernel_size - 1)
            done = (j >= 0) & (torch.remainder(j, sc.kernel_stride) == 0)
            k1_start = torch.div(j.clamp(min=0), sc.kernel_stride, rounding_mode="floor").to(torch.int32)
            k1_count = done.to(torch.int32)
        return cls(backend, positions, slots, seq_lens, cos, sin, decode, sparse, k1_start, k1_count,
                   list(segments), timer)

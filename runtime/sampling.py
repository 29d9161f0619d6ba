"""Per-request sampling parameters and the sampler (greedy / temperature / top-k / top-p)."""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass

import torch

from salactl.errors import NumericsError, UsageError

NON_FINITE = ("the model computed NaN/Inf logits: its weights hold NaN/Inf, or the activations "
              "overflowed the dtype; check the checkpoint, or run with --dtype bfloat16 or float32")


@dataclass(frozen=True)
class SamplingParams:
    """Per-request generation settings. A sampled request (temperature > 0) draws from its own
    generator seeded with `seed`; None means 0, so unseeded requests are reproducible, not random."""

    max_new_tokens: int = 64
    temperature: float = 0.0          # 0 = greedy
    top_p: float = 1.0
    top_k: int = 0                    # 0 = off
    seed: int | None = None
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False

    def __post_init__(self) -> None:
        for name in ("max_new_tokens", "top_k"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, numbers.Integral):   # numpy ints pass
                raise UsageError(f"--{name.replace('_', '-')} must be an integer, got {value!r}")
        if self.max_new_tokens < 0:
            raise UsageError(f"--max-new-tokens must be >= 0, got {self.max_new_tokens}")
        if not 0 <= self.temperature < math.inf:
            raise UsageError(f"--temperature must be a finite number >= 0 (0 = greedy), got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise UsageError(f"--top-p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise UsageError(f"--top-k must be >= 0 (0 = off), got {self.top_k}")
        if self.seed is not None and not 0 <= self.seed < 2**63:
            raise UsageError(f"--seed must be in [0, 2^63), got {self.seed}")


def greedy(logits: torch.Tensor) -> list[int]:
    """The argmax of each row of logits [n, V], in one device sync; NaN/Inf logits are an error
    (an argmax over them would silently repeat one token)."""
    top = logits.max(dim=-1)
    values, ids = torch.stack([top.values.float(), top.indices.float()]).tolist()  # ids < 2^24: exact
    if not all(math.isfinite(v) for v in values):
        raise NumericsError(NON_FINITE)
    return [int(i) for i in ids]


def sample(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None) -> int:
    """logits: fp32 [V] for one sequence."""
    if params.temperature == 0.0:
        return greedy(logits[None])[0]
    top = logits.max()
    if not math.isfinite(float(top)):
        raise NumericsError(NON_FINITE)
    logits = (logits.float() - top) / params.temperature    # shifted first: a tiny temperature gives -inf, not inf - inf
    if params.top_k:
        kth = torch.topk(logits, min(params.top_k, logits.numel())).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if params.top_p < 1.0:
        # HF's TopPLogitsWarper to the bit: the same ascending torch.sort (so tied logits at the cut
        # go the way HF's go), drop while the cumulative mass is <= 1 - top_p, keep the top token
        sorted_logits, order = torch.sort(logits, descending=False)
        drop = torch.softmax(sorted_logits, dim=-1).cumsum(-1) <= 1 - params.top_p
        drop[-1] = False
        logits = logits.scatter(0, order, sorted_logits.masked_fill(drop, float("-inf")))
    probs = torch.softmax(logits, dim=-1)
    return int(torch.multinomial(probs, 1, generator=generator))

"""Perplexity through the runtime Engine (chunked prefill, the same attention path as generation,
so windows longer than dense_len are scored with InfLLM-V2 sparse attention), and a unigram baseline.

Scoring: the token stream is cut into non-overlapping windows of `seq_len` positions. With a
`bos_id` each window is `<s>` + seq_len-1 text tokens and every text token is scored (as the
model was trained); without one, each window scores its tokens 2..seq_len.
"""

from __future__ import annotations

import math
from collections import Counter
from typing import Callable, Iterator

import torch
import torch.nn.functional as F

from salactl.errors import DatasetError, NumericsError, UsageError
from salactl.runtime.sampling import NON_FINITE


def score_windows(token_ids: list[int], seq_len: int, max_tokens: int | None,
                  bos_id: int | None = None) -> Iterator[list[int]]:
    """Yield the windows (model inputs); window[1:] are the scored targets."""
    if seq_len < 2:
        raise UsageError(f"--seq-len must be at least 2, got {seq_len}")
    if max_tokens is not None and max_tokens < 1:
        raise UsageError(f"--max-tokens must be positive, got {max_tokens}")
    prefix = [] if bos_id is None else [bos_id]
    body = seq_len - len(prefix)
    step = body if prefix else body - 1          # without bos a window's first token is context only
    budget = max_tokens if max_tokens is not None else math.inf
    i = 0
    while budget > 0 and i + (0 if prefix else 1) < len(token_ids):
        window = prefix + token_ids[i:i + body]
        window = window[: int(min(len(window), budget + 1))]
        if len(window) < 2:
            break
        yield window
        budget -= len(window) - 1
        i += step


def scored_targets(token_ids: list[int], seq_len: int, max_tokens: int | None,
                   bos_id: int | None = None) -> list[int]:
    return [t for w in score_windows(token_ids, seq_len, max_tokens, bos_id) for t in w[1:]]


def _device(model) -> torch.device:
    for t in model.parameters():
        return t.device
    return torch.device("cpu")


def perplexity(model, token_ids: list[int], seq_len: int, max_tokens: int | None,
               progress: Callable[[int, int], None] | None = None, bos_id: int | None = None,
               chunk_size: int = 512, backend=None) -> dict:
    """Mean next-token NLL (nats) and perplexity over the scored tokens; progress(done, total)."""
    from salactl.runtime.engine import Engine

    windows = list(score_windows(token_ids, seq_len, max_tokens, bos_id))
    if not windows:
        raise DatasetError("the text is too short to score: it needs at least 2 tokens")
    vocab = model.config.vocab_size
    bad = next((t for w in windows for t in w if not 0 <= t < vocab), None)
    if bad is not None:
        raise UsageError(f"token id {bad} is outside the model's vocabulary (size {vocab}); "
                         "use the model's own tokenizer")
    engine = Engine(model, _device(model), chunk_size=chunk_size, backend=backend)
    total = sum(len(w) - 1 for w in windows)
    nll_sum, done = 0.0, 0
    for w in windows:
        seq = engine.new_sequence()
        logits = engine.prefill(seq, w, all_logits=True)
        target = torch.tensor(w[1:], device=logits.device)
        nll_sum += float(F.cross_entropy(logits[:-1].float(), target, reduction="sum"))
        done += len(w) - 1
        if progress:
            progress(done, total)
    nll = nll_sum / total
    if not math.isfinite(nll):
        raise NumericsError(NON_FINITE)
    return {"nll": nll, "ppl": math.exp(nll) if nll < 700 else math.inf, "tokens": total, "windows": len(windows), "seq_len": seq_len}


def unigram_baseline(targets: list[int], vocab_size: int, fit_ids: list[int] | None = None) -> dict:
    """NLL of a unigram model. Without `fit_ids` it is fit on `targets` themselves (maximum
    likelihood, the best any unigram model can do on this text: a strict baseline); with them it is
    fit there with add-one smoothing over the vocabulary."""
    if not targets:
        raise DatasetError("no tokens to score for the unigram baseline")
    if fit_ids is None:
        counts, n, smooth = Counter(targets), len(targets), 0
    else:
        counts, n, smooth = Counter(fit_ids), len(fit_ids), 1
    denom = n + smooth * vocab_size
    nll = -sum(math.log((counts.get(t, 0) + smooth) / denom) for t in targets) / len(targets)
    return {"nll": nll, "ppl": math.exp(nll), "tokens": len(targets),
            "fit": "evaluated text (MLE)" if fit_ids is None else f"{n} tokens, add-one"}

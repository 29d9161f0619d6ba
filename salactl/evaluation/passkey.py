"""Passkey retrieval (Mohtashami & Jaggi, "Landmark Attention", 2023): a 5-digit number is hidden at a
chosen depth inside repetitive filler text and asked for at the end. The prompt is assembled from
separately tokenized segments so its length in tokens is exact (each after the first encoded as text that
follows other text, so the ids read as the constants join); training (tools/train_nano.py) and evaluation
build prompts with the same function.
"""

from __future__ import annotations

import random
import re
import weakref
from typing import Callable

from salactl.errors import UsageError

INSTRUCTION = "A pass key is hidden in the text below. Find it and remember it.\n"
FILLER = (" The grass is green.", " The sky is blue.", " The sun is yellow.", " Here we go.",
          " There and back again.")
NEEDLE = " The pass key is {key}. Remember it. {key} is the pass key."
QUESTION = "\nWhat is the pass key? The pass key is"
ANSWER = " {key}."
KEY_DIGITS = 5
ANSWER_TOKENS = KEY_DIGITS + 3      # generated after the prompt: the number and what follows it


class _Segments:
    """Token ids of the fixed prompt pieces, cached per tokenizer object for as long as it lives."""

    _cache: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

    def __init__(self, tokenizer):
        self.bos = list(tokenizer.prefix_ids)       # what default encoding puts first (<s>), if anything
        self.instruction = tokenizer.encode(INSTRUCTION, add_special_tokens=False)
        self.sentences = [_following(tokenizer, s) for s in FILLER]
        self.question = _following(tokenizer, QUESTION)

    @classmethod
    def of(cls, tokenizer) -> "_Segments":
        if tokenizer not in cls._cache:
            cls._cache[tokenizer] = cls(tokenizer)
        return cls._cache[tokenizer]


def _following(tokenizer, text: str) -> list[int]:
    """`text`'s ids where it follows other text (no "▁" word-start mark of its own in a
    SentencePiece-style tokenizer, which would read as a doubled space)."""
    return tokenizer.encode(text, add_special_tokens=False, continuation=True)


def _filler(segs: _Segments, n_tokens: int) -> tuple[list[int], list[int]]:
    """`n_tokens` filler ids (the sentences cycled, the last one cut) and its sentence boundaries."""
    ids, bounds, i = [], [0], 0
    while len(ids) < n_tokens:
        ids.extend(segs.sentences[i % len(segs.sentences)])
        bounds.append(len(ids))
        i += 1
    return ids[:n_tokens], sorted({b for b in bounds if b <= n_tokens} | {n_tokens})


def make_passkey_prompt(tokenizer, length_tokens: int, depth: float, rng: random.Random):
    """Return (prompt_ids, answer_str): exactly `length_tokens` ids (bos included when the tokenizer
    adds one) with the needle at the sentence boundary nearest `depth` (0 = start, 1 = end)."""
    ids, key, _ = _passkey_prompt(tokenizer, length_tokens, depth, rng)
    return ids, key


def _passkey_prompt(tokenizer, length_tokens: int, depth: float, rng: random.Random):
    """make_passkey_prompt's (ids, key) and the token index where the needle starts."""
    if not 0.0 <= depth <= 1.0:
        raise UsageError(f"passkey depth must be in [0, 1], got {depth}")
    key = str(rng.randint(10 ** (KEY_DIGITS - 1), 10 ** KEY_DIGITS - 1))
    segs = _Segments.of(tokenizer)
    needle = _following(tokenizer, NEEDLE.format(key=key))
    fixed = len(segs.bos) + len(segs.instruction) + len(needle) + len(segs.question)
    n_fill = length_tokens - fixed
    if n_fill < 0:
        raise UsageError(f"passkey length {length_tokens} is too short; the prompt needs at least "
                         f"{fixed} tokens")
    filler, bounds = _filler(segs, n_fill)
    at = min(bounds, key=lambda b: (abs(b - depth * n_fill), b))
    ids = segs.bos + segs.instruction + filler[:at] + needle + filler[at:] + segs.question
    assert len(ids) == length_tokens
    return ids, key, len(segs.bos) + len(segs.instruction) + at


def answer_ids(tokenizer, answer: str) -> list[int]:
    """The ids a model should produce after the prompt (training targets)."""
    return _following(tokenizer, ANSWER.format(key=answer))


def extract_answer(text: str) -> str | None:
    m = re.match(r"\s*(\d+)", text)
    return m.group(1) if m else None


def trial_rng(seed: int, length: int, depth: float, trial: int) -> random.Random:
    """A depth that 6 decimals hold exactly keeps the seed it always had; any other is seeded with all
    its digits, so depths that differ only past 6 decimals get trials of their own."""
    shown = f"{depth:.6f}"
    return random.Random(f"passkey:{seed}:{length}:{shown if float(shown) == depth else repr(float(depth))}:{trial}")


def _model_device(model):
    for t in model.parameters():
        return t.device
    for t in model.buffers():
        return t.device
    raise UsageError("the model has no parameters or buffers; cannot tell its device")


PROMPT_ID_BYTES = 8      # a Python list holds one 8-byte reference per token id


def passkey_prompt_bytes(lengths: list[int], depths: list[float], trials: int) -> int:
    """Host bytes of every prompt, all built up front as lists of ids."""
    return PROMPT_ID_BYTES * sum(lengths) * len(depths) * trials


def passkey_memory_bytes(config, act_bytes: int, lengths: list[int], depths: list[float], trials: int,
                         chunk_size: int, kv_cache_dtype: str = "bf16") -> tuple[int, int]:
    """(host, prefill) bytes of a run: every prompt is built up front (passkey_trials) and held as a
    list of ids; one at a time runs, the longest needing the most: its KV cache at its peak and states
    (answer included) and the reference engine's prefill workspace and attention scores
    (perplexity.engine_prefill_bytes)."""
    from salactl.evaluation.perplexity import engine_prefill_bytes

    longest = max(lengths)
    prefill = engine_prefill_bytes(config, longest, longest + ANSWER_TOKENS, chunk_size, act_bytes, kv_cache_dtype)
    return passkey_prompt_bytes(lengths, depths, trials), prefill


def check_passkey_memory(config, device, act_bytes: int, lengths: list[int], depths: list[float],
                         trials: int, chunk_size: int, weights: int = 0, kv_cache_dtype: str = "bf16") -> None:
    """Exit 11 before anything is built when the prompts (host) and the longest prompt's prefill plus
    the `weights` still to load (the model's device) need more memory than is available; the error
    names a --chunk-size that fits."""
    from salactl.evaluation.perplexity import check_eval_memory
    from salactl.units import human_bytes

    prompts, prefill = passkey_memory_bytes(config, act_bytes, lengths, depths, trials, chunk_size, kv_cache_dtype)
    count = len(lengths) * len(depths) * trials
    loading = f"; the model's weights: {human_bytes(weights)}" if weights else ""
    what = (f"eval passkey ({count:,} prompt{'' if count == 1 else 's'}: {human_bytes(prompts)}; the longest "
            f"one's prefill, {max(lengths):,} tokens at --chunk-size {chunk_size:,}: {human_bytes(prefill)} of KV "
            f"cache in --kv-cache-dtype {kv_cache_dtype}, states and the reference engine's workspace and "
            f"attention scores{loading})")
    check_eval_memory(device, what, prompts,
                      lambda chunk: passkey_memory_bytes(config, act_bytes, lengths, depths, trials, chunk,
                                                         kv_cache_dtype)[1],
                      chunk_size, "shorter --lengths, fewer --depths or fewer --trials", weights)


def passkey_trials(tokenizer, lengths: list[int], depths: list[float], trials: int, seed: int) -> list[dict]:
    """Every prompt of a passkey run, built before any generation so that a length too short for the
    prompt is an error up front: one {length, depth, ids, key, needle_at} per trial, in run order
    (needle_at: the token index where the needle starts)."""
    if trials <= 0:
        raise UsageError(f"--trials must be positive, got {trials}")
    out = []
    for length in lengths:
        for depth in depths:
            for trial in range(trials):
                rng = trial_rng(seed, length, depth, trial)
                ids, key, needle_at = _passkey_prompt(tokenizer, length, depth, rng)
                out.append({"length": length, "depth": depth, "ids": ids, "key": key, "needle_at": needle_at})
    return out


def run_passkey(model, tokenizer, prompts: list[dict], chunk_size: int = 512,
                progress: Callable[[int, int], None] | None = None, model_dir=None,
                kv_cache_dtype: str = "bf16") -> list[dict]:
    """Greedy-decode the answer of every prompt of `passkey_trials` through the runtime Engine; a
    trial is correct when the answer starts with the passkey's number (leading spaces allowed). One
    row per (length, depth), with the token index of each trial's needle (needle_positions).
    Generation stops at `stop_token_ids` (with `model_dir`'s generation_config.json when given).
    kv_cache_dtype: the Engine's (an FP8 cache uses the model's calibrated scales, as every Engine does)."""
    from salactl.runtime.engine import Engine
    from salactl.runtime.loader import stop_token_ids
    from salactl.runtime.sampling import SamplingParams

    engine = Engine(model, _model_device(model), chunk_size=chunk_size, kv_cache_dtype=kv_cache_dtype)
    params = SamplingParams(max_new_tokens=ANSWER_TOKENS, temperature=0.0)
    eos = stop_token_ids(model.config, model_dir, tokenizer)
    correct: dict[tuple[int, float], list[bool]] = {}
    needles: dict[tuple[int, float], list[int]] = {}
    for done, p in enumerate(prompts, 1):
        out = engine.generate(p["ids"], params, eos_ids=eos).output_token_ids
        cell = (p["length"], p["depth"])
        correct.setdefault(cell, []).append(extract_answer(tokenizer.decode(out)) == p["key"])
        needles.setdefault(cell, []).append(p["needle_at"])
        if progress:
            progress(done, len(prompts))
    return [{"length": n, "depth": d, "trials": len(ok), "correct": sum(ok), "accuracy": sum(ok) / len(ok),
             "needle_positions": needles[n, d]} for (n, d), ok in correct.items()]

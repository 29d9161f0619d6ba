"""Passkey retrieval (Mohtashami & Jaggi, "Landmark Attention", 2023): a 5-digit number is hidden at a
chosen depth inside repetitive filler text and asked for at the end. The prompt is assembled from
separately tokenized segments so its length in tokens is exact; training (tools/train_nano.py) and
evaluation build prompts with the same function.
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
        enc = lambda s: tokenizer.encode(s, add_special_tokens=False)  # noqa: E731
        self.bos = list(tokenizer.prefix_ids)       # what default encoding puts first (<s>), if anything
        self.instruction = enc(INSTRUCTION)
        self.sentences = [enc(s) for s in FILLER]
        self.question = enc(QUESTION)

    @classmethod
    def of(cls, tokenizer) -> "_Segments":
        if tokenizer not in cls._cache:
            cls._cache[tokenizer] = cls(tokenizer)
        return cls._cache[tokenizer]


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
    if not 0.0 <= depth <= 1.0:
        raise UsageError(f"passkey depth must be in [0, 1], got {depth}")
    key = str(rng.randint(10 ** (KEY_DIGITS - 1), 10 ** KEY_DIGITS - 1))
    segs = _Segments.of(tokenizer)
    needle = tokenizer.encode(NEEDLE.format(key=key), add_special_tokens=False)
    fixed = len(segs.bos) + len(segs.instruction) + len(needle) + len(segs.question)
    n_fill = length_tokens - fixed
    if n_fill < 0:
        raise UsageError(f"passkey length {length_tokens} is too short; the prompt needs at least "
                         f"{fixed} tokens")
    filler, bounds = _filler(segs, n_fill)
    at = min(bounds, key=lambda b: (abs(b - depth * n_fill), b))
    ids = segs.bos + segs.instruction + filler[:at] + needle + filler[at:] + segs.question
    assert len(ids) == length_tokens
    return ids, key


def answer_ids(tokenizer, answer: str) -> list[int]:
    """The ids a model should produce after the prompt (training targets)."""
    return tokenizer.encode(ANSWER.format(key=answer), add_special_tokens=False)


def extract_answer(text: str) -> str | None:
    m = re.match(r"\s*(\d+)", text)
    return m.group(1) if m else None


def trial_rng(seed: int, length: int, depth: float, trial: int) -> random.Random:
    return random.Random(f"passkey:{seed}:{length}:{depth:.6f}:{trial}")


def _model_device(model):
    for t in model.parameters():
        return t.device
    for t in model.buffers():
        return t.device
    raise UsageError("the model has no parameters or buffers; cannot tell its device")


PROMPT_ID_BYTES = 8      # a Python list holds one 8-byte reference per token id


def passkey_memory_bytes(config, act_bytes: int, lengths: list[int], depths: list[float],
                         trials: int) -> tuple[int, int]:
    """(host, cache) bytes of a run: every prompt is built up front (passkey_trials) and held as a
    list of ids; one at a time runs, its KV cache (sparse layers) the size of the longest."""
    from salactl.reports.memory import gla_state_bytes, kv_bytes_per_token

    prompts = PROMPT_ID_BYTES * sum(lengths) * len(depths) * trials
    kv_dtype = {2: "bfloat16", 4: "float32"}[act_bytes]
    return prompts, max(lengths) * kv_bytes_per_token(config, kv_dtype) + gla_state_bytes(config)


def check_passkey_memory(config, device, act_bytes: int, lengths: list[int], depths: list[float],
                         trials: int) -> None:
    """Exit 11 before anything is built when the prompts (host) and the cache (the model's device)
    need more memory than is available."""
    from salactl.units import human_bytes
    from salactl.runtime.loader import available_bytes, available_host_bytes, check_fits

    prompts, cache = passkey_memory_bytes(config, act_bytes, lengths, depths, trials)
    count = len(lengths) * len(depths) * trials
    what = (f"eval passkey ({count:,} prompt{'' if count == 1 else 's'}: {human_bytes(prompts)}; the longest "
            f"one's cache: {human_bytes(cache)})")
    fix = "use shorter --lengths, fewer --depths or fewer --trials"
    if device.type == "cpu":
        check_fits(prompts + cache, available_host_bytes(), what, "this machine", fix)
    else:
        check_fits(prompts, available_host_bytes(), what, "this machine", fix)
        check_fits(cache, available_bytes(device), what, str(device), fix)


def passkey_trials(tokenizer, lengths: list[int], depths: list[float], trials: int, seed: int) -> list[dict]:
    """Every prompt of a passkey run, built before any generation so that a length too short for the
    prompt is an error up front: one {length, depth, ids, key} per trial, in run order."""
    if trials <= 0:
        raise UsageError(f"--trials must be positive, got {trials}")
    out = []
    for length in lengths:
        for depth in depths:
            for trial in range(trials):
                ids, key = make_passkey_prompt(tokenizer, length, depth, trial_rng(seed, length, depth, trial))
                out.append({"length": length, "depth": depth, "ids": ids, "key": key})
    return out


def run_passkey(model, tokenizer, prompts: list[dict], chunk_size: int = 512,
                progress: Callable[[int, int], None] | None = None, model_dir=None,
                kv_cache_dtype: str = "bf16") -> list[dict]:
    """Greedy-decode the answer of every prompt of `passkey_trials` through the runtime Engine; a
    trial is correct when the answer starts with the passkey's number (leading spaces allowed). One row per (length, depth).
    Generation stops at `stop_token_ids` (with `model_dir`'s generation_config.json when given).
    kv_cache_dtype: the Engine's (an FP8 cache uses the model's calibrated scales, as every Engine does)."""
    from salactl.runtime.engine import Engine
    from salactl.runtime.loader import stop_token_ids
    from salactl.runtime.sampling import SamplingParams

    engine = Engine(model, _model_device(model), chunk_size=chunk_size, kv_cache_dtype=kv_cache_dtype)
    params = SamplingParams(max_new_tokens=ANSWER_TOKENS, temperature=0.0)
    eos = stop_token_ids(model.config, model_dir, tokenizer)
    cells: dict[tuple[int, float], list[int]] = {}
    for done, p in enumerate(prompts, 1):
        out = engine.generate(p["ids"], params, eos_ids=eos).output_token_ids
        cells.setdefault((p["length"], p["depth"]), []).append(extract_answer(tokenizer.decode(out)) == p["key"])
        if progress:
            progress(done, len(prompts))
    return [{"length": n, "depth": d, "trials": len(ok), "correct": sum(ok), "accuracy": sum(ok) / len(ok)}
            for (n, d), ok in cells.items()]

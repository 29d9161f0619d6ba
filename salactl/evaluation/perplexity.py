"""Perplexity through the runtime Engine (chunked prefill, the same attention path as generation,
so windows longer than dense_len are scored with InfLLM-V2 sparse attention), and a unigram baseline.

Scoring: the token stream is cut into non-overlapping windows of `seq_len` positions. With a
`bos_id` each window is `<s>` + seq_len-1 text tokens and every text token is scored (as the
model was trained); without one, each window scores its tokens 2..seq_len.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from typing import Callable, Iterator

import torch
import torch.nn.functional as F

from salactl.bench.sweep_sizes import sweep_prefill_bytes
from salactl.errors import DatasetError, NumericsError, UsageError
from salactl.runtime.sampling import NON_FINITE


def score_windows(token_ids: list[int], seq_len: int, max_tokens: int | None,
                  bos_id: int | None = None) -> Iterator[list[int]]:
    """Yield the windows (model inputs), one at a time; window[1:] are the scored targets: seq_len - 1
    of them a window, after <s> (with bos_id) or after the id before them (without)."""
    prefix = [] if bos_id is None else [bos_id]
    first, end = _target_run(len(token_ids), seq_len, max_tokens, bos_id)
    for start in range(first, end, seq_len - 1):
        yield prefix + token_ids[start - first:min(start + seq_len - 1, end)]


def scored_targets(token_ids: list[int], seq_len: int, max_tokens: int | None,
                   bos_id: int | None = None) -> list[int]:
    """Every window's window[1:], in order: one run of the ids (the windows leave no gap)."""
    first, end = _target_run(len(token_ids), seq_len, max_tokens, bos_id)
    return token_ids[first:end]


def longest_window(n_tokens: int, seq_len: int, max_tokens: int | None,
                   bos_id: int | None = None) -> int:
    """The length of score_windows' longest (its first) window over `n_tokens` ids, 0 where it
    yields none; counted, not built (one window may hold the whole text)."""
    first, end = _target_run(n_tokens, seq_len, max_tokens, bos_id)
    return min(end - first, seq_len - 1) + 1 if end > first else 0


def _target_run(n_tokens: int, seq_len: int, max_tokens: int | None,
                bos_id: int | None) -> tuple[int, int]:
    """[first, end) of the ids the windows score: all (without bos_id all but the first, context
    only), up to max_tokens of them."""
    if seq_len < 2:
        raise UsageError(f"--seq-len must be at least 2, got {seq_len}")
    if max_tokens is not None and max_tokens < 1:
        raise UsageError(f"--max-tokens must be positive, got {max_tokens}")
    first = 0 if bos_id is not None else 1
    end = max(n_tokens, first)
    return first, end if max_tokens is None else min(end, first + max_tokens)


# Characters per piece of encode_text: the tokenizers library holds ~500 B per token of a string it
# encodes (ids, token strings, offsets, masks), a list of ids ~40, so the text is encoded in pieces
PIECE_CHARS = 1 << 16
CUT_CONTEXT_CHARS = 256     # text either side of a cut that encode_text re-encodes to confirm the cut
CUT_TRIES = 4               # cuts in a row that must fail before encode_text takes the rest whole
LONG_LINE = 4               # pieces a line may run before encode_text cuts it between words
# Where a text has no whitespace (minified JSON): between punctuation and a letter or digit
_PUNCTUATION_EDGE = re.compile(r"(?<=[^\w\s])(?=[^\W_])|(?<=[^\W_])(?=[^\w\s])")


def encode_text(tok, text: str, limit: int | None, what: str, piece_chars: int = PIECE_CHARS) -> list[int]:
    """tok.encode(text, add_special_tokens=False, specials_as_text=True)[:limit] (every id where limit
    is None), encoded a piece at a time and stopping once `limit` ids are in. A piece ends before the
    whitespace that ends a line (or, in a text without whitespace, after punctuation): a GPT-2-style
    (ByteLevel) pre-tokenizer always splits between a non-space character and a space, and between
    punctuation and a letter, so the pieces' ids are the whole text's; for any tokenizer a cut
    is kept only where the text around it encodes to the same ids whole as in two parts. Every piece
    after the first is encoded as text that follows other text (tok.encode's continuation), without the
    word-start mark a SentencePiece-style tokenizer gives a text's start. `what` names the text in the
    error where a piece is too long for the tokenizer's memory (exit 11)."""
    from salactl.input_files import check_tokenizer_memory

    def encode(s: str, continuation: bool = True) -> list[int]:
        return tok.encode(s, add_special_tokens=False, specials_as_text=True, continuation=continuation)

    ids, start, tries = [], 0, CUT_TRIES
    while start < len(text) and (limit is None or len(ids) < limit):
        end, tries = _next_cut(encode, text, start, piece_chars, tries)
        check_tokenizer_memory(text[start:end], what, "give a shorter text")
        ids += encode(text[start:end], continuation=start > 0)
        start = end
    return ids if limit is None else ids[:limit]      # no copy of every id when nothing is cut


def _next_cut(encode, text: str, start: int, piece_chars: int, tries: int) -> tuple[int, int]:
    """(where the piece from `start` ends, the failed cuts still allowed): the first cut that holds
    (_cut_candidate's) from `piece_chars` past `start` on; the text's end where none holds before
    `tries` runs out. The check encodes its text as following other text, which the text's own start
    may not (a SentencePiece-style word-start mark): the first piece's cuts are tried only past its context."""
    at = start + piece_chars
    while tries and at < len(text):
        cut, after = _cut_candidate(text, start, at, piece_chars)
        if cut > (start or CUT_CONTEXT_CHARS):
            if _cut_holds(encode, text, start, cut):
                return cut, CUT_TRIES
            tries -= 1
        at = after if after is not None else re.compile(re.escape(text[at]) + "*").match(text, at).end()
    return len(text), 0


def _cut_candidate(text: str, start: int, at: int, piece_chars: int) -> tuple[int, int | None]:
    """(a cut at or after `at`, where to look for the next one should it not hold), within LONG_LINE
    pieces of `at`: before the spaces ending a line, else between words, else between punctuation and a
    letter or digit, else at `at` itself (the next one past the run of `text[at]`: None)."""
    stop = at + LONG_LINE * piece_chars
    for space in (text.find("\n", at, stop), text.find(" ", at, stop)):
        if space >= 0:
            cut = space
            while cut > start and text[cut - 1].isspace():
                cut -= 1
            return cut, space + 1
    edge = _PUNCTUATION_EDGE.search(text, at, stop)
    if edge:
        return edge.start(), edge.start() + 1
    return at, None


def _cut_holds(encode, text: str, start: int, cut: int) -> bool:
    """Whether the text around `cut` encodes to the same ids whole as in two parts, with the context
    starting at two characters in a row: a run the tokenizer merges in blocks counted from its start
    ("-----") then splits at the cut from at most one of them."""
    for context in (CUT_CONTEXT_CHARS, CUT_CONTEXT_CHARS - 1):
        a, b = max(start, cut - context), min(len(text), cut + context)
        if encode(text[a:b]) != encode(text[a:cut]) + encode(text[cut:b]):
            return False
    return True


# fp32 [window, vocab] logits held at once at the peak: the chunks' logits and their torch.cat in
# Engine.prefill, then the logits and cross_entropy's log-softmax; the freed chunks' memory is not
# reused for the log-softmax (a 16,384-token window of sala-nano peaks at 3.3 copies above the run's)
LOGIT_COPIES = 3


def perplexity_memory_bytes(config, act_bytes: int, window: int, chunk_size: int, kv_cache_dtype: str = "bf16") -> int:
    """A window's scoring on the reference engine: its prefill (KV cache at its peak and states, one
    chunk's workspace and attention scores, as engine_prefill_bytes counts them) and the window's logits."""
    logits = LOGIT_COPIES * 4 * window * config.vocab_size
    return engine_prefill_bytes(config, window, window, chunk_size, act_bytes, kv_cache_dtype) + logits


def engine_prefill_bytes(config, prompt: int, cached: int, chunk: int, act_bytes: int,
                         kv_cache_dtype: str = "bf16") -> int:
    """One sequence on the reference engine, at the model's own dense_len: sweep_prefill_bytes of a
    `prompt` prefilled `chunk` tokens at a time with `cached` tokens cached in the end, the cache
    stored as `kv_cache_dtype` (--kv-cache-dtype)."""
    return sweep_prefill_bytes(config, prompt, cached, 1, chunk, config.sparse_config.dense_len, act_bytes,
                               kv_cache_dtype)


def model_weight_bytes(config, quantization: dict | None, act_bytes: int) -> int:
    """The weights as loaded: every parameter in the activation dtype, or a GPTQ checkpoint's packed
    linears (`quantization`: its quantization_config, loader.model_quantization's) and the rest."""
    if quantization is None:
        return config.parameter_count() * act_bytes
    from salactl.quant.loading import parse_quant_config
    from salactl.reports.memory import weight_bytes

    spec = parse_quant_config(quantization)
    return weight_bytes(config, f"w{spec['bits']}a16", spec["group_size"], act_bytes).total


def check_perplexity_memory(config, device, act_bytes: int, window: int, chunk_size: int,
                            kv_cache_dtype: str = "bf16", weights: int = 0) -> None:
    """Exit 11 before scoring when the longest window (`window` tokens) and the `weights` not loaded
    yet do not fit the model's device."""
    what = (f"eval ppl (the longest window's prefill, {window:,} tokens at --chunk-size {chunk_size:,}: KV cache "
            f"in --kv-cache-dtype {kv_cache_dtype}, states, the reference engine's workspace and attention scores, "
            f"and {LOGIT_COPIES} copies of the window's fp32 logits)")
    check_eval_memory(device, what, 0,
                      lambda chunk: perplexity_memory_bytes(config, act_bytes, window, chunk, kv_cache_dtype),
                      chunk_size, "a shorter --seq-len (or --max-tokens)", weights)


def check_eval_memory(device, what: str, host_bytes: int, device_bytes: Callable[[int], int], chunk_size: int,
                      alternatives: str, weights: int = 0) -> None:
    """A CapacityError (exit 11) when `host_bytes` (host memory) and device_bytes(chunk_size) plus the
    `weights` not loaded yet (the model's device: the host too, on CPU) need more than is available:
    "WHAT needs N, but WHERE has M available; use --chunk-size C or less, or ALTERNATIVES", C the
    largest chunk that fits."""
    from salactl.profiling.preflight import largest_fitting
    from salactl.runtime.loader import available_bytes, available_host_bytes, check_fits

    on_cpu = device.type == "cpu"
    if not on_cpu:
        check_fits(host_bytes, available_host_bytes(), what, "this machine", f"use {alternatives}")
        host_bytes = 0
    room = available_bytes(device)
    fixed = host_bytes + weights
    need = fixed + device_bytes(chunk_size)
    if room is None or need <= room:
        return
    best = largest_fitting(lambda chunk: fixed + device_bytes(chunk) <= room, chunk_size)
    if best:
        fix = f"use --chunk-size {best:,} or less, or {alternatives}"
    elif weights and weights >= room:
        fix = "the weights alone leave no room; use a smaller --dtype or a quantized checkpoint (salactl quantize)"
    else:
        fix = f"use {alternatives}"
    check_fits(need, room, what, "this machine" if on_cpu else str(device), fix)


def _device(model) -> torch.device:
    for t in model.parameters():
        return t.device
    return torch.device("cpu")


def perplexity(model, token_ids: list[int], seq_len: int, max_tokens: int | None,
               progress: Callable[[int, int], None] | None = None, bos_id: int | None = None,
               chunk_size: int = 512, kv_cache_dtype: str = "bf16", what: str = "the text") -> dict:
    """Mean next-token NLL (nats) and perplexity over the scored tokens; progress(done, total).
    kv_cache_dtype: the Engine's, as `salactl run --kv-cache-dtype` (fp8 uses the model's scales).
    what: where the ids come from, e.g. "--file e.txt", named where there are too few to score."""
    from salactl.runtime.engine import Engine

    check_scorable(token_ids, seq_len, max_tokens, bos_id, model.config.vocab_size, what)
    first, end = _target_run(len(token_ids), seq_len, max_tokens, bos_id)
    engine = Engine(model, _device(model), chunk_size=chunk_size, kv_cache_dtype=kv_cache_dtype)
    total, windows = end - first, -(-(end - first) // (seq_len - 1))
    nll_sum, done = 0.0, 0
    for w in score_windows(token_ids, seq_len, max_tokens, bos_id):
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
    return {"nll": nll, "ppl": math.exp(nll) if nll < 700 else math.inf, "tokens": total, "windows": windows, "seq_len": seq_len}


def check_scorable(token_ids: list[int], seq_len: int, max_tokens: int | None, bos_id: int | None, vocab: int,
                   what: str = "the text") -> None:
    """perplexity's refusals that need only the ids (before a model loads): too few of them to score
    (DatasetError), or one past the vocabulary of `vocab` ids (UsageError)."""
    first, end = _target_run(len(token_ids), seq_len, max_tokens, bos_id)
    if end == first:
        least = 1 if bos_id is not None else 2          # without <s> a window's first token is context only
        raise DatasetError(f"{what} is too short to score: it has {len(token_ids)} token(s) and needs at least "
                           f"{least}; give a longer text")
    _check_vocabulary(token_ids, end, bos_id, vocab)


def _check_vocabulary(token_ids: list[int], end: int, bos_id: int | None, vocab: int) -> None:
    """A UsageError naming the first id the windows hold (bos_id, token_ids[:end]) past the vocabulary."""
    from itertools import chain, islice

    held = chain([] if bos_id is None else [bos_id], islice(token_ids, end))
    bad = next((t for t in held if not 0 <= t < vocab), None)
    if bad is not None:
        raise UsageError(f"token id {bad} is outside the model's vocabulary (size {vocab}); "
                         "use the model's own tokenizer")


def unigram_baseline(targets: list[int]) -> dict:
    """NLL of a unigram model fit on `targets` themselves (maximum likelihood, the best any unigram
    model can do on this text: a strict baseline)."""
    if not targets:
        raise DatasetError("no tokens to score for the unigram baseline")
    counts, n = Counter(targets), len(targets)
    nll = -sum(math.log(counts[t] / n) for t in targets) / n
    return {"nll": nll, "ppl": math.exp(nll), "tokens": n, "fit": "evaluated text (MLE)"}

"""The sweep's sizes against host memory, before the model loads: prompts, the KL's logits and (on
CPU) every prefill's caches and reference-engine workspace that cannot fit are a CapacityError
(exit 11), not a MemoryError or a machine run out of memory."""

from __future__ import annotations

import inspect
import itertools

from salactl.bench.grid_memory import cache_bytes_per_request
from salactl.bench.synthetic import check_host_memory, prompt_set_bytes
from salactl.errors import SalactlError
from salactl.evaluation.passkey import ANSWER_TOKENS
from salactl.lists import parse_list
from salactl.runtime.kv_fp8 import kv_item_bytes

# float64 [tokens, vocab] logits alive at once in the KL: the dense reference, the point's, and
# logit_kl's log-softmaxes, probabilities and products (plus the engine's own copy)
KL_LOGIT_COPIES = 8
KL_REFERENCE_CHUNK = 512        # prefill chunk of the dense KL reference (its speed is not measured)
# fp32 [heads, n, keys] tensors the reference engine holds at once for a prefill chunk of n queries:
# the scores, their softmax and a copy einsum makes (ops/attention/reference.py; 6,000 dense queries
# over 6,000 keys on sala-nano peak 3.4 GB above the run's 0.55 GB, 3 x 1.15 GB). Sparse rows hold as
# many over the compressed windows (the block selection).
SCORE_COPIES = 3


def attention_scores_bytes(config, tokens: int, chunk: int, dense_len: int) -> int:
    """The reference engine's largest attention temporaries over the prefill chunks of a prompt of
    `tokens`: a dense row (t + 1 < dense_len) scores every cached key, a sparse row every compressed
    window."""
    from salactl.runtime.ops.selection import num_windows

    # A chunk's size grows with its start within the all-dense and the all-sparse chunks (num_windows
    # does not decrease), so the largest is among the chunks next to the dense_len boundary and the
    # last two: O(1) candidates for any prompt length.
    last = (tokens - 1) // chunk * chunk
    edge = max(0, dense_len - 2) // chunk * chunk
    starts = {0, edge - chunk, edge, edge + chunk, last - chunk, last}
    worst = 0
    for start in (s for s in starts if 0 <= s < tokens):
        end = min(start + chunk, tokens)
        dense = max(0, min(end, dense_len - 1) - start)
        worst = max(worst, dense * end + (end - start - dense) * num_windows(end, config.sparse_config))
    return SCORE_COPIES * 4 * config.num_attention_heads * worst


def dequantized_kv_bytes(config, cached: int, kv_cache_dtype: str, item: int) -> int:
    """An FP8 cache's temporaries while the reference engine attends: one sparse layer's `cached` keys
    and values dequantized to the activation dtype (SequenceCache.dequantized), the values' peak
    holding the keys and either two fp32 copies or an fp32 copy and the result (kv_fp8.dequantize_kv);
    0 for a cache stored as values."""
    if kv_item_bytes(kv_cache_dtype, item) == item:
        return 0
    return config.num_key_value_heads * config.head_dim * cached * (item + max(8, 4 + item))


def prefill_bytes(config, tokens: int, cached: int, batch: int, chunk: int, dense_len: int, item: int,
                  kv_cache_dtype: str = "bf16") -> int:
    """A reference-engine prefill of `tokens` at `chunk` tokens per forward: the caches of `batch`
    requests of `cached` tokens (keys and values stored as `kv_cache_dtype`), one chunk's activations
    (reports/memory.py), the attention scores and an FP8 cache's dequantized keys and values."""
    from salactl.reports.memory import prefill_workspace_bytes

    return (batch * cache_bytes_per_request(config, cached, kv_item_bytes(kv_cache_dtype, item), item)
            + prefill_workspace_bytes(config, min(chunk, tokens), item)
            + attention_scores_bytes(config, tokens, chunk, dense_len)
            + dequantized_kv_bytes(config, cached, kv_cache_dtype, item))


def kv_capacity(prompt: int, total: int, chunk: int) -> tuple[int, int]:
    """(capacity, capacity before its last growth; 0 where it never grew) in tokens of a reference-engine
    sequence's KV cache once `total` tokens are in it: the `prompt` appended `chunk` at a time, then one
    token a step. SequenceCache.append_kv (runtime/cache.py) grows a full buffer to the larger of what
    the append needs and twice its capacity."""
    from salactl.runtime.cache import SequenceCache

    cap = inspect.signature(SequenceCache).parameters["capacity"].default
    before = length = 0
    for limit, step in ((prompt, chunk), (total, 1)):
        while length < limit:
            length += max(0, min(cap, limit) - length) // step * step      # the appends that fit as it is
            if length < limit:
                end = min(length + step, limit)
                if end > cap:
                    before, cap = cap, max(end, 2 * cap)
                length = end
    return cap, before


def kv_growth_bytes(config, prompt: int, total: int, chunk: int, kv_bytes: int) -> int:
    """The reference engine's KV cache at its peak beyond `total` tokens' keys and values (what
    prefill_bytes counts): every sparse layer's capacity past them (kv_capacity), and the last
    layer's old values, alive while append_kv copies them into its grown buffer."""
    cap, before = kv_capacity(prompt, total, chunk)
    one = config.num_key_value_heads * config.head_dim * kv_bytes       # a token's keys (or values) in a layer
    return one * (2 * len(config.sparse_layers) * (cap - total) + before)


def sweep_prefill_bytes(config, tokens: int, cached: int, batch: int, chunk: int, dense_len: int, item: int,
                        kv_cache_dtype: str = "bf16") -> int:
    """prefill_bytes plus what each request's reference-engine KV cache holds at its peak beyond its
    `cached` tokens (it grows by doubling and keeps the old copy while it grows), as run and eval count
    it (kv_growth_bytes)."""
    return (prefill_bytes(config, tokens, cached, batch, chunk, dense_len, item, kv_cache_dtype)
            + batch * kv_growth_bytes(config, tokens, cached, chunk, kv_item_bytes(kv_cache_dtype, item)))


def _check_prefill(config, avail: int, prefill: tuple, chunk: int, dense_len: int, item: int,
                   kv_cache_dtype: str = "bf16", chunk_fix: bool = True) -> None:
    """prefill: (what, the flag that sizes it, prompt tokens, tokens cached, requests)."""
    from salactl.profiling.preflight import largest_fitting
    from salactl.runtime.loader import check_fits

    what, flag, tokens, cached, batch = prefill
    def need(c: int) -> int:
        return sweep_prefill_bytes(config, tokens, cached, batch, c, dense_len, item, kv_cache_dtype)

    if need(chunk) <= avail:
        return
    best = largest_fitting(lambda c: need(c) <= avail, chunk) if chunk_fix else 0
    fix = f"use --chunk-size {best:,} or less, or lower {flag}" if best else f"lower {flag}"
    check_fits(need(chunk), avail, f"{what}: {batch} request(s) of {cached:,} tokens, prefilled {chunk:,} at a "
               f"time with dense_len {dense_len:,} (the KV cache in --kv-cache-dtype {kv_cache_dtype} and states, "
               "the cache at its peak as it grows by doubling, and the reference engine's prefill workspace)",
               "this machine", fix)


def check_sizes_fit(s, device) -> None:
    """`s`: SweepSettings whose values are checked already; `device`: the resolved torch.device."""
    from salactl.bench.sweep_grid import KV_DTYPES, parse_ints, parse_names
    from salactl.bench.targets.embedded import DEFAULT_CHUNK
    from salactl.runtime.loader import DTYPES, available_host_bytes, planning_config, resolve_dtype

    check_host_memory(prompt_set_bytes(s.requests, s.requests * s.input_len),
                      f"--requests {s.requests:,} prompts of --input-len {s.input_len:,} tokens",
                      "lower --requests or --input-len")
    try:
        config = planning_config(s.model)
    except SalactlError:
        return                          # loading the model says why, after the sweep's own checks
    kl_tokens = (s.kl_len or s.input_len) if s.kl else 0
    if kl_tokens:
        check_host_memory(KL_LOGIT_COPIES * 8 * kl_tokens * config.vocab_size,
                          f"the logit KL over {kl_tokens:,} tokens x {config.vocab_size:,} vocabulary",
                          "lower --kl-len (default: --input-len), or pass --no-kl")
    avail = available_host_bytes()
    if device.type != "cpu" or avail is None:
        return                          # GPU caches: the GPU engine's --mem-fraction budget decides
    # the widest activation dtype a point runs in: --dtype's, or a --weight-dtype cast to fp32/fp16/bf16
    casts = [DTYPES[w].itemsize for w in parse_list(s.weight_dtype, "--weight-dtype", str)
             if w in DTYPES] if s.weight_dtype else []
    item = max([resolve_dtype(s.dtype, device).itemsize, *casts])
    lengths = parse_list(s.passkey_lengths, "--passkey-lengths", int) if s.passkey else []
    batch = max(parse_list(s.batch_size, "--batch-size", int)) if s.batch_size else 1
    chunks = parse_ints(s.chunk_size, "chunk-size", DEFAULT_CHUNK["reference"])
    dense_lens = parse_ints(s.dense_len, "dense-len", config.sparse_config.dense_len, minimum=0)
    prefills = [("the speed workload", "--input-len/--output-len", s.input_len, s.input_len + s.output_len, batch)]
    if kl_tokens:
        _check_prefill(config, avail, ("the dense KL reference", "--kl-len (or pass --no-kl)", kl_tokens,
                                       kl_tokens, 1), KL_REFERENCE_CHUNK, kl_tokens + 1, item, chunk_fix=False)
        prefills.append(("the KL prompt", "--kl-len", kl_tokens, kl_tokens, 1))
    prefills += [("a passkey prompt", "--passkey-lengths", n, n + ANSWER_TOKENS, 1) for n in lengths]
    kv_dtypes = parse_names(s.kv_dtype, "kv-cache-dtype", "bf16", KV_DTYPES)
    for chunk, dense_len, kv, prefill in itertools.product(chunks, dense_lens, kv_dtypes, prefills):
        _check_prefill(config, avail, prefill, chunk, dense_len, item, kv)

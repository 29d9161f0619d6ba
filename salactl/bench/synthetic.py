"""Synthetic request sets with exact token lengths: random token-id prompts, so no tokenizer is
needed and no decode/re-encode round trip changes a length (vLLM #17408, sglang #15732).

`soar_like`: the length mix MiniCPM-SALA's speed benchmark states, scaled by `scale`:
  inputs   0–4K 25%, 4–16K 13⅓%, 16–32K 13⅓%, 32–128K 35%, 128–160K 13⅓%
  outputs  0–512 35%, 512–2K 25%, 2–4K 13⅓%, 4–16K 13⅓%, 16–32K 13⅓%
(the stated shares are 25/35% and 35/25%; the unstated 40% is split evenly over the other three
bins). Counts per bin use largest-remainder apportionment so even 12 requests follow the mix;
lengths are uniform inside each bin; inputs and outputs are paired after independent shuffles.

`random_lengths`: vLLM's random dataset: lengths uniform in [L(1−r), L(1+r)], so the default
r = 0 gives exactly L (SGLang's `--random-range-ratio 0` would give [1, L] instead).
"""

from __future__ import annotations

import math

import numpy as np

from salactl.bench.requests import BenchRequest
from salactl.errors import CapacityError, UsageError

K = 1024
SOAR_INPUT_BINS = ((0, 4 * K, 0.25), (4 * K, 16 * K, 0.40 / 3), (16 * K, 32 * K, 0.40 / 3),
                   (32 * K, 128 * K, 0.35), (128 * K, 160 * K, 0.40 / 3))
SOAR_OUTPUT_BINS = ((0, 512, 0.35), (512, 2 * K, 0.25), (2 * K, 4 * K, 0.40 / 3),
                    (4 * K, 16 * K, 0.40 / 3), (16 * K, 32 * K, 0.40 / 3))


# host bytes per prompt token: a Python int (28) and its tuple slot (8) in the request, plus the
# int64 it is drawn into (8); per request: the BenchRequest, its id string and lengths (rounded up)
BYTES_PER_PROMPT_TOKEN = 44
BYTES_PER_REQUEST = 512
GENERIC_SIZE_FIX = "lower the number of requests or their lengths"


def prompt_set_bytes(num_requests: int, prompt_tokens: int) -> int:
    return num_requests * BYTES_PER_REQUEST + prompt_tokens * BYTES_PER_PROMPT_TOKEN


def check_host_memory(need: int, what: str, fix: str) -> None:
    """Refuse a prompt set that cannot fit in the host's available memory before building it: numpy
    would raise a MemoryError, and a slow build of Python objects would run the machine out of memory."""
    from salactl.runtime.loader import available_host_bytes, check_fits

    check_fits(need, available_host_bytes(), what, "this machine", fix)


def apportion(n: int, shares: list[float]) -> list[int]:
    """Largest-remainder apportionment of n items over shares (ties → earlier bin)."""
    total = sum(shares)
    quotas = [n * s / total for s in shares]
    counts = [int(q) for q in quotas]
    order = sorted(range(len(shares)), key=lambda i: (-(quotas[i] - counts[i]), i))
    for i in order[: n - sum(counts)]:
        counts[i] += 1
    return counts


# a length past int64 (the positions every engine counts in) is past any machine's memory as well
MAX_TOKENS = 2**63 - 1


def scaled(length: int, scale: float, least: int = 2) -> int:
    """`length` tokens times --scale, rounded (half to even), at least `least`."""
    product = length * scale
    # refused here, in numbers that still read: the memory check would print a 30-digit count of TiB
    if not math.isfinite(product) or product > MAX_TOKENS:
        raise CapacityError(f"--scale {scale:g} scales a length of {length:,} tokens to {product:.3g}, past any "
                            "machine's memory; lower --scale")
    return max(least, round(product))


def _bin_lengths(bins, n: int, scale: float, rng: np.random.Generator) -> list[int]:
    counts = apportion(n, [b[2] for b in bins])
    lengths = []
    for (lo, hi, _), c in zip(bins, counts):
        lengths += [scaled(int(x), scale) for x in rng.integers(lo + 1, hi + 1, size=c)]
    rng.shuffle(lengths)
    return lengths


def token_range(vocab_size: int) -> tuple[int, int]:
    """Ids drawn for random prompts: skip the low ids where special tokens usually live."""
    lo = 100 if vocab_size > 1000 else 3
    return lo, vocab_size


def random_prompt(n: int, vocab_size: int, rng: np.random.Generator) -> tuple[int, ...]:
    lo, hi = token_range(vocab_size)
    return tuple(int(x) for x in rng.integers(lo, hi, size=n))


def soar_like(num_requests: int, scale: float, vocab_size: int, seed: int = 1,
              prefix: str = "r", fix: str = GENERIC_SIZE_FIX) -> list[BenchRequest]:
    if num_requests <= 0:
        raise UsageError(f"the synthetic SOAR set needs at least 1 request, got {num_requests}")
    if scale <= 0:
        raise UsageError(f"--scale must be positive, got {scale}")
    check_host_memory(prompt_set_bytes(num_requests, 0), f"the synthetic SOAR set of {num_requests:,} requests", fix)
    rng = np.random.default_rng(seed)
    ins = _bin_lengths(SOAR_INPUT_BINS, num_requests, scale, rng)
    outs = _bin_lengths(SOAR_OUTPUT_BINS, num_requests, scale, rng)
    check_host_memory(prompt_set_bytes(num_requests, sum(ins)),
                      f"the synthetic SOAR set ({num_requests:,} prompts, {sum(ins):,} tokens at scale {scale:g})", fix)
    return [BenchRequest(f"{prefix}{i}", a, b, random_prompt(a, vocab_size, rng))
            for i, (a, b) in enumerate(zip(ins, outs))]


def random_lengths(num_requests: int, input_len: int, output_len: int, vocab_size: int,
                   range_ratio: float = 0.0, seed: int = 1, prefix: str = "r",
                   fix: str = GENERIC_SIZE_FIX) -> list[BenchRequest]:
    if num_requests <= 0:
        raise UsageError(f"the random dataset needs at least 1 request, got {num_requests}")
    if input_len < 1 or output_len < 1:
        raise UsageError(f"random lengths must be >= 1 token, got input {input_len}, output {output_len}")
    if not 0.0 <= range_ratio < 1.0:
        raise UsageError(f"range_ratio must be in [0, 1), got {range_ratio}")
    shortest = max(1, int(input_len * (1 - range_ratio)))      # the least it can need, before drawing
    check_host_memory(prompt_set_bytes(num_requests, num_requests * shortest),
                      f"the random dataset ({num_requests:,} prompts of at least {shortest:,} tokens)", fix)
    rng = np.random.default_rng(seed)

    def draw(L: int) -> list[int]:
        lo, hi = max(1, int(L * (1 - range_ratio))), int(L * (1 + range_ratio))
        return [int(x) for x in rng.integers(lo, hi + 1, size=num_requests)]

    ins, outs = draw(input_len), draw(output_len)
    check_host_memory(prompt_set_bytes(num_requests, sum(ins)),
                      f"the random dataset ({num_requests:,} prompts, {sum(ins):,} tokens)", fix)
    return [BenchRequest(f"{prefix}{i}", a, b, random_prompt(a, vocab_size, rng))
            for i, (a, b) in enumerate(zip(ins, outs))]

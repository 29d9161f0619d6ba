"""Decode selection's top-k for short rows at larger batch: one program per row, its score words
in registers, radix select. Launched by triton_rank.topk_launch after triton_decode's
`_lse_kernel` and `_block_words_kernel` (every pass-2 program stores its blocks' int32 score
words and adds them to the row's 4096-bin histogram of the top 12 word bits) when the batch has
more rows than SelectionTuning.rank_short_rows: counting ranks (triton_rank.py) costs ncand^2
compares per row, which at 128K context beat this select up to batch 2-4 and lost from batch 8
(H200, session 16: 128K + 100 batch 8 52-73 us against 47 us for the selection, batch 32 203-293
against 140).

Hand-written for the reason triton_decode.py gives (a graph-safe top-k whose cost follows each
row's length, read on the device). The keys are "higher score first, ties -> lower block": the
int64 sort key is word high, 2^32-1-b low (unique). Long rows take triton_rank.py's gather +
rank.
"""

from __future__ import annotations

import triton
import triton.language as tl

from salactl.runtime.ops.pdl import pdl_wait

SENTINEL = tl.constexpr(-(2 ** 63))     # "no block": its score word is 0, below every real key


@triton.jit
def _score_word(key):
    """Order-preserving unsigned score word of a key; 0 only for SENTINEL."""
    hi = (key >> 32).to(tl.int32)
    return hi.to(tl.uint32, bitcast=True) ^ 0x80000000


@triton.jit
def _sort_key(w, b):
    """int64 sort key of block b with int32 score word w: word high, 2^32-1-b low (unique;
    larger = higher score, then lower b)."""
    return w.to(tl.int64) * 4294967296 + (4294967295 - b.to(tl.int64))


@triton.jit
def _score_u(word_row, b, m):
    """Unsigned order-preserving score words of blocks b (0 where not m: below every real word).
    Plain loads: the words come from an earlier kernel."""
    w = tl.load(word_row + b, mask=m, other=0)
    return tl.where(m, w.to(tl.uint32, bitcast=True) ^ 0x80000000, 0)


@triton.jit
def _pick_digit(hd, need, prefix, SH: tl.constexpr, NB: tl.constexpr):
    """From the counts hd [NB] of the candidates' digit at SH: the digit d holding the need-th
    largest, the new prefix (prefix | d << SH) and need minus the candidates above d."""
    dig = tl.arange(0, NB)
    ge = tl.sum(hd, 0) - tl.cumsum(hd, 0) + hd                    # candidates with digit >= d
    d = tl.max(tl.where(ge >= need, dig, 0), 0)
    return prefix | (d.to(tl.uint32) << SH), need - tl.sum(tl.where(dig > d, hd, 0), 0)


@triton.jit
def _write_ranked(run, sel_ptr, cnt_ptr, KP: tl.constexpr):
    """Block ids of the picked keys in descending key order, and their count."""
    nvalid = tl.sum((_score_word(run) > 0).to(tl.int32), 0)
    ranked = tl.sort(run, descending=True)                          # SENTINEL sorts last
    k = tl.arange(0, KP)
    tl.store(sel_ptr + k, -1 - ranked.to(tl.int32), mask=k < nvalid)   # low word = 2^32-1-b
    tl.store(cnt_ptr, nvalid)


@triton.jit
def _radix_row(word_row, h1_ptr, ncand, pick_row, sel_row, cnt_ptr, K: tl.constexpr,
               KP: tl.constexpr, SMALL: tl.constexpr):
    """The whole top-k of a row with ncand <= SMALL blocks in one program, its words in
    registers: radix select on the unsigned score word (the top 12 bits from pass 2's histogram,
    then five 4-bit digits, each one 16-bin tl.histogram over the tile: on the H200 13.0 us per
    call at 128K against 14.7 for 8-, 8- and 4-bit digits, since tl.histogram's cost grows with
    its bins), ties taken lowest block first by their running count in block order; the picks go
    through pick_row to _write_ranked. No atomics and no serial pass over a candidate buffer.
    tl.histogram is the cheapest count here (alternatives measured: BENCHMARKS.md, "Tuning notes
    moved from code comments")."""
    b = tl.arange(0, SMALL)
    m = b < ncand
    u = _score_u(word_row, b, m)              # the keys are built for the picks only
    h1 = tl.load(h1_ptr + tl.arange(0, 4096), cache_modifier=".cg")
    pre, need = _pick_digit(h1, tl.minimum(ncand, K), tl.zeros([], tl.uint32), 20, 4096)
    live = m & ((u >> 20) == (pre >> 20))
    for i in tl.static_range(5):                  # word bits 19..0 as five 4-bit digits
        pre, need = _pick_digit(tl.histogram(((u >> (16 - 4 * i)) & 15).to(tl.int32), 16, mask=live),
                                need, pre, 16 - 4 * i, 16)
        live = live & ((u >> (16 - 4 * i)) == (pre >> (16 - 4 * i)))
    tie = m & (u == pre)
    pick = m & ((u > pre) | (tie & (tl.cumsum(tie.to(tl.int32), 0) <= need)))
    total = tl.sum(pick.to(tl.int32), 0)
    key = _sort_key((u ^ 0x80000000).to(tl.int32, bitcast=True), b)
    tl.store(pick_row + tl.cumsum(pick.to(tl.int32), 0) - 1, key, mask=pick)
    tl.debug_barrier()                                    # every thread's picks, then read by all
    k = tl.arange(0, KP)
    run = tl.load(pick_row + k, mask=k < total, other=SENTINEL, cache_modifier=".cg")
    _write_ranked(run, sel_row, cnt_ptr, KP)


@triton.jit
def _radix_kernel(seqlen_ptr, word_ptr, ctr_ptr, pick_ptr, sel_ptr, cnt_ptr,
                  s_word, s_seln, s_selh, s_cntn, s_cnth,
                  HKV: tl.constexpr, BS: tl.constexpr, NCTR: tl.constexpr, K: tl.constexpr,
                  KP: tl.constexpr, SMALL: tl.constexpr, PDL: tl.constexpr = False):
    """Rows of at most SMALL candidate blocks (grid: rows; longer rows exit). A kernel of its
    own: compiled into the long rows' kernel it made that one 1.6-7 us slower at 1M (session 8).
    pick: KP int64 per row."""
    pdl_wait(PDL)
    r = tl.program_id(0)
    n = r // HKV
    kh = r % HKV
    ncand = (tl.load(seqlen_ptr + n) - 1) // BS + 1
    if ncand <= SMALL:
        _radix_row(word_ptr + r.to(tl.int64) * s_word, ctr_ptr + r * NCTR + 1, ncand,
                   pick_ptr + r.to(tl.int64) * KP, sel_ptr + n * s_seln + kh * s_selh,
                   cnt_ptr + n * s_cntn + kh * s_cnth, K, KP, SMALL)


def radix_constexprs(hkv: int, block_size: int, K: int, small: int, nctr: int) -> dict:
    """The compile-time arguments `_radix_kernel` is launched with (also what
    tools/sass_loops.py compiles offline)."""
    return dict(HKV=hkv, BS=block_size, NCTR=nctr, K=K, KP=triton.next_power_of_2(K), SMALL=small)

"""Decode selection's top-k, launched after triton_decode's `_lse_kernel` and
`_block_words_kernel` (every pass-2 program stores its blocks' int32 score words and adds them to
the row's 4096-bin histogram of the top 12 word bits).

Hand-written for the reason triton_decode.py gives (a graph-safe top-k whose cost follows each
row's length, read on the device). Rows of at most SMALL candidate blocks (4096: contexts up to
256K) are done by `_thresh_one_kernel`, one program per row with the words in registers
(`_thresh_one_program`). For longer rows one program reading all the row's words (16,384 at 1M
context; the removed topk="hist", and one-program variants of 8192-16384 words in session 8) was
slower on the H200; there the read is spread over the grid:

`_thresh_kernel` (grid rows x chunks of CH blocks; chunks past the row's ncand exit at once):
each program loads the row's histogram, finds with one cumsum the bin T holding the K-th largest
word (K = min(topk, ncand)), reads its chunk's words and appends the int64 sort keys (word high,
2^32-1-b low: unique, "higher score first, ties -> lower block") strictly above T's bin to the
row's pick buffer and those inside it to the row's candidate buffer, reserving each range with
one atomic_add on a per-row counter (so the buffers are in no particular order), and adds its
candidates to the row's second-level 4096-bin histogram of the next 12 word bits (bits 8-19 of
u; global atomics). The row's last program (atomic ticket) finishes with little serial work:
one cumsum over the second-level histogram gives the 24-bit prefix bin T2 holding the need-th
largest; one pass over the candidates appends those above T2 to the picks and moves those in
T2 (usually a handful: scores spread over 2^12 times finer bins) to a second buffer while
histogramming their last 8 bits; the digit holding the need-th largest is the exact threshold
word. Only when fewer than all of its ties are taken do digit rounds on the keys' low word
(the block index) over T2's keys find the exact key threshold, so ties resolve to lower block
indices whatever the buffer order. T2's keys >= that threshold are appended to the picks;
`_write_ranked` sorts them. Counters (ticket, the two reservations, both histograms) sit in the
row's counter slots that `_lse_kernel`'s split 0 zeroes on every call.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from salactl.runtime.ops.pdl import launch_args, pdl_wait

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
def _unsigned_word(word_ptr, b, m):
    """(u, key64) of blocks b from their int32 score words: u = word ^ 2^31 (unsigned order =
    score order), key = _sort_key."""
    w = tl.load(word_ptr + b, mask=m, other=0, cache_modifier=".cg")
    return w.to(tl.uint32, bitcast=True) ^ 0x80000000, _sort_key(w, b)


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


# Counter slots per row: [0] ticket, [1:4097] the top-12-bit bins (pass 2), [4097] keys above
# the threshold bin (the pick buffer's length), [4098] keys inside it (the candidates' length),
# [4099:8195] the candidates' bins of word bits 8-19 (this launch).
PICKS, CANDS, BINS2 = tl.constexpr(4097), tl.constexpr(4098), tl.constexpr(4099)
NCTR = 4099 + 4096


@triton.jit
def _split_key(key):
    """(u, lw) of int64 sort keys: u = score word ^ 2^31 (unsigned score order), lw = the low
    word 2^32-1-b (unsigned; larger = lower block index)."""
    u = (key >> 32).to(tl.int32).to(tl.uint32, bitcast=True) ^ 0x80000000
    return u, key.to(tl.int32).to(tl.uint32, bitcast=True)


@triton.jit
def _index_digit_hist(cand_ptr, nc, thr, plw, SH: tl.constexpr, MSH: tl.constexpr, CTILE: tl.constexpr):
    """[256] counts of digit (lw >> SH) & 255 over the candidates with u == thr whose lw bits
    >= MSH equal plw's (MSH 32: all of them)."""
    h = tl.zeros([256], tl.int32)
    for t0 in range(0, nc, CTILE):
        i = t0 + tl.arange(0, CTILE)
        key = tl.load(cand_ptr + i, mask=i < nc, other=0, cache_modifier=".cg")
        u, lw = _split_key(key)
        m = (i < nc) & (u == thr)
        if MSH < 32:
            m = m & ((lw >> MSH) == (plw >> MSH))
        h += tl.histogram(((lw >> SH) & 255).to(tl.int32), 256, mask=m)
    return h


@triton.jit
def _thresh_finish(cand_ptr, nc, cand2_ptr, h2, pick_ptr, above, thr, need, CTILE: tl.constexpr,
                   NR: tl.constexpr):
    """Exact threshold over the candidates (keys whose top 12 word bits are the threshold bin,
    in any order; h2 [4096]: their counts by word bits 8-19) and the append of those at or above
    it to pick[above:]; returns the pick count. thr: the bin's prefix (word bits >= 20), need:
    how many to take inside the bin. cand2: room for nc keys. NR: 8-bit digit rounds covering
    the block index (block ids < 2^(8 NR))."""
    prefix, need = _pick_digit(h2, need, thr, 8, 4096)          # the 24-bit bin T2
    base = above
    n2 = tl.zeros([], tl.int32)
    hd = tl.zeros([256], tl.int32)
    for t0 in range(0, nc, CTILE):                    # above T2 -> picks, in T2 -> cand2
        i = t0 + tl.arange(0, CTILE)
        key = tl.load(cand_ptr + i, mask=i < nc, other=0, cache_modifier=".cg")
        u, lw = _split_key(key)
        hi = (i < nc) & ((u >> 8) > (prefix >> 8))
        eq = (i < nc) & ((u >> 8) == (prefix >> 8))
        tl.store(pick_ptr + base + tl.cumsum(hi.to(tl.int32), 0) - 1, key, mask=hi)
        tl.store(cand2_ptr + n2 + tl.cumsum(eq.to(tl.int32), 0) - 1, key, mask=eq)
        base += tl.sum(hi.to(tl.int32), 0)
        n2 += tl.sum(eq.to(tl.int32), 0)
        hd += tl.histogram((u & 255).to(tl.int32), 256, mask=eq)
    prefix, need = _pick_digit(hd, need, prefix, 0, 256)
    ties = tl.sum(tl.where(tl.arange(0, 256) == (prefix & 255).to(tl.int32), hd, 0), 0)
    tl.debug_barrier()                                # cand2 written by every thread, read by all
    plw = tl.zeros([], tl.uint32)                     # take every key == prefix with lw >= plw
    if ties > need:                                   # some ties stay out: lower block ids first
        if NR < 4:                                    # the bits no block id reaches: all ones
            plw = tl.full([], 0xFFFFFFFF, tl.uint32) << (8 * NR)
        for rd in tl.static_range(NR):              # digit at 8 (NR - 1 - rd)
            plw, need = _pick_digit(_index_digit_hist(cand2_ptr, n2, prefix, plw, 8 * (NR - 1 - rd),
                                                      8 * (NR - rd), CTILE),
                                    need, plw, 8 * (NR - 1 - rd), 256)
    for t0 in range(0, n2, CTILE):
        i = t0 + tl.arange(0, CTILE)
        key = tl.load(cand2_ptr + i, mask=i < n2, other=0, cache_modifier=".cg")
        u, lw = _split_key(key)
        pick = (i < n2) & ((u > prefix) | ((u == prefix) & (lw >= plw)))
        tl.store(pick_ptr + base + tl.cumsum(pick.to(tl.int32), 0) - 1, key, mask=pick)
        base += tl.sum(pick.to(tl.int32), 0)
    return base


@triton.jit
def _thresh_one_program(word_row, h1_ptr, ncand, pick_row, sel_row, cnt_ptr, K: tl.constexpr,
                        KP: tl.constexpr, SMALL: tl.constexpr):
    """The whole top-k of a row with ncand <= SMALL blocks in one program, its words in
    registers: radix select on the unsigned score word (the top 12 bits from pass 2's histogram,
    then five 4-bit digits, each one 16-bin tl.histogram over the tile: on the H200 13.0 us per
    call at 128K against 14.7 for 8-, 8- and 4-bit digits, since tl.histogram's cost grows with
    its bins), ties taken lowest block first by their running count in block order; the picks go
    through pick_row to _write_ranked. No atomics and no serial pass over a candidate buffer (the
    grid-parallel path's finish). Session 12 (H200, 128K, 12.9 us): the rounds as a loop (3,400
    instead of 4,232 SASS instructions) 13.7 us, the picks placed by rank instead of tl.sort 14.5,
    the digit counts from packed int64 register sums instead of tl.histogram 17.1: less code is
    not faster, and tl.histogram is the cheapest count."""
    b = tl.arange(0, SMALL)
    m = b < ncand
    u, _ = _unsigned_word(word_row, b, m)     # the keys are rebuilt for the picks only
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
def _thresh_chunk(word_row, row_ctr, ncand, b0, pick_row, cand_row, s_cand2, sel_row, cnt_ptr,
                  K: tl.constexpr, KP: tl.constexpr, CH: tl.constexpr, CTILE: tl.constexpr, NR: tl.constexpr):
    """The grid-parallel path: one chunk program's part (see the module docstring); the row's
    last program (atomic ticket) finishes. row_ctr: [ticket, bins, #picks, #candidates, bins2]."""
    h1 = tl.load(row_ctr + 1 + tl.arange(0, 4096), cache_modifier=".cg")
    thr, need = _pick_digit(h1, tl.minimum(ncand, K), tl.zeros([], tl.uint32), 20, 4096)
    b = b0 + tl.arange(0, CH)
    m = b < ncand
    u, key = _unsigned_word(word_row, b, m)
    hi = m & ((u >> 20) > (thr >> 20))
    eq = m & ((u >> 20) == (thr >> 20))
    at_hi = tl.atomic_add(row_ctr + PICKS, tl.sum(hi.to(tl.int32), 0), sem="relaxed")
    at_eq = tl.atomic_add(row_ctr + CANDS, tl.sum(eq.to(tl.int32), 0), sem="relaxed")
    tl.store(pick_row + at_hi + tl.cumsum(hi.to(tl.int32), 0) - 1, key, mask=hi)
    tl.store(cand_row + at_eq + tl.cumsum(eq.to(tl.int32), 0) - 1, key, mask=eq)
    tl.atomic_add(row_ctr + BINS2 + ((u >> 8) & 4095).to(tl.int32), tl.full([CH], 1, tl.int32), mask=eq,
                  sem="relaxed")
    tl.debug_barrier()                                     # all of this program's keys, then the ticket
    if tl.atomic_add(row_ctr, 1) == tl.cdiv(ncand, CH) - 1:      # the row's last program
        above = tl.atomic_add(row_ctr + PICKS, 0)
        nc = tl.atomic_add(row_ctr + CANDS, 0)
        h2 = tl.load(row_ctr + BINS2 + tl.arange(0, 4096), cache_modifier=".cg")
        total = _thresh_finish(cand_row, nc, cand_row + s_cand2, h2, pick_row, above, thr, need, CTILE, NR)
        tl.debug_barrier()
        k = tl.arange(0, KP)
        run = tl.load(pick_row + k, mask=k < total, other=SENTINEL, cache_modifier=".cg")
        _write_ranked(run, sel_row, cnt_ptr, KP)


@triton.jit
def _thresh_kernel(seqlen_ptr, word_ptr, ctr_ptr, pick_ptr, cand_ptr, sel_ptr, cnt_ptr,
                   s_word, s_cand, s_cand2, s_seln, s_selh, s_cntn, s_cnth,
                   HKV: tl.constexpr, BS: tl.constexpr, NCTR: tl.constexpr, K: tl.constexpr,
                   KP: tl.constexpr, CH: tl.constexpr, CTILE: tl.constexpr, NR: tl.constexpr,
                   SMALL: tl.constexpr = 0, PDL: tl.constexpr = False):
    """The grid-parallel path for rows of more than SMALL candidate blocks."""
    pdl_wait(PDL)
    r = tl.program_id(0)
    c = tl.program_id(1)
    n = r // HKV
    kh = r % HKV
    ncand = (tl.load(seqlen_ptr + n) - 1) // BS + 1       # blocks 0..own are candidates
    b0 = c * CH
    if (ncand > SMALL) & (b0 < ncand):
        _thresh_chunk(word_ptr + r.to(tl.int64) * s_word, ctr_ptr + r * NCTR, ncand, b0,
                      pick_ptr + r.to(tl.int64) * KP, cand_ptr + r.to(tl.int64) * s_cand, s_cand2,
                      sel_ptr + n * s_seln + kh * s_selh, cnt_ptr + n * s_cntn + kh * s_cnth,
                      K, KP, CH, CTILE, NR)


@triton.jit
def _thresh_one_kernel(seqlen_ptr, word_ptr, ctr_ptr, pick_ptr, sel_ptr, cnt_ptr,
                       s_word, s_seln, s_selh, s_cntn, s_cnth,
                       HKV: tl.constexpr, BS: tl.constexpr, NCTR: tl.constexpr, K: tl.constexpr,
                       KP: tl.constexpr, SMALL: tl.constexpr, PDL: tl.constexpr = False):
    """The one-program path for rows of at most SMALL candidate blocks (grid: rows). A kernel of
    its own: compiled into _thresh_kernel it made the grid path 1.6-7 us slower at 1M context."""
    pdl_wait(PDL)
    r = tl.program_id(0)
    n = r // HKV
    kh = r % HKV
    ncand = (tl.load(seqlen_ptr + n) - 1) // BS + 1
    if ncand <= SMALL:
        _thresh_one_program(word_ptr + r.to(tl.int64) * s_word, ctr_ptr + r * NCTR + 1, ncand,
                            pick_ptr + r.to(tl.int64) * KP, sel_ptr + n * s_seln + kh * s_selh,
                            cnt_ptr + n * s_cntn + kh * s_cnth, K, KP, SMALL)


def one_program_constexprs(hkv: int, block_size: int, K: int, small: int) -> dict:
    """The compile-time arguments `_thresh_one_kernel` is launched with (also what
    tools/sass_loops.py compiles offline)."""
    return dict(HKV=hkv, BS=block_size, NCTR=NCTR, K=K, KP=triton.next_power_of_2(K), SMALL=small)


def thresh_launch(seq_lens, words, ctr, sel, cnt, hkv: int, block_size: int, K: int, chunk: int,
                  ctile: int, num_warps: int, small: int = 0) -> None:
    """The top-k over pass 2's words [rows, nb_max] int32 and counters [rows * NCTR] int32
    (top-12-bit histogram built, the other slots zero); writes sel/cnt. small (0 or a power of
    2): rows of at most this many candidate blocks are done by _thresh_one_kernel, the others by
    the grid-parallel _thresh_kernel (two launches; small 0: the grid path only)."""
    rows, nb_max = words.shape
    KP = triton.next_power_of_2(K)
    nr = max(1, triton.cdiv(max(1, (nb_max - 1).bit_length()), 8))
    pick = words.new_empty(rows * KP, dtype=torch.int64)
    sel_strides = (sel.stride(0), sel.stride(1), cnt.stride(0), cnt.stride(1))
    if small:
        _thresh_one_kernel[(rows,)](seq_lens, words, ctr, pick, sel, cnt, words.stride(0), *sel_strides,
                                    **one_program_constexprs(hkv, block_size, K, small),
                                    num_warps=num_warps, **launch_args(words.device))
        if nb_max <= small:
            return
    cand = words.new_empty(rows, 2, nb_max, dtype=torch.int64)      # the bin's keys, then T2's
    _thresh_kernel[(rows, triton.cdiv(nb_max, chunk))](
        seq_lens, words, ctr, pick, cand, sel, cnt, words.stride(0), cand.stride(0), cand.stride(1),
        *sel_strides, HKV=hkv, BS=block_size, NCTR=NCTR, K=K, KP=KP, CH=chunk, CTILE=ctile, NR=nr, SMALL=small,
        num_warps=num_warps, **launch_args(words.device))

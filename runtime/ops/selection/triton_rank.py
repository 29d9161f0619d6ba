"""Decode selection's top-k by counting ranks, launched after triton_decode's `_lse_kernel` and
`_block_words_kernel` (every pass-2 program stores its blocks' int32 score words and adds them to
the row's 4096-bin histogram of the top 12 word bits).

Hand-written for the reason triton_decode.py gives (a graph-safe top-k whose cost follows each
row's length, read on the device). The output order is the reference's: descending score, ties
-> lower block index, i.e. descending int64 sort key (word high, 2^32-1-b low; unique). A key's
place in that order is its rank, the number of keys above it, so every key can be placed
independently: no sort, no serial finish, no dependent chain beyond one read of the keys.

`_rank_kernel` (grid rows x P programs, RB keys per program and step): a row of at most SMALL
candidate blocks (128K context: 2,049) ranks its score words directly. Block i's rank is
#{j < i: u_j >= u_i} + #{j > i: u_j > u_i} (u: the unsigned score word), so each tile of other
blocks costs one unsigned compare per pair: u_j > u_i - 1 for tiles before the program's blocks,
u_j > u_i after them, both on the one tile holding them. Work is RB x ncand compares per program
(ncand^2 per row): cheap for a few rows, but it grows with the batch, so from more than
`short_rows` rows on (topk_launch) short rows take triton_radix.py's one-program radix select
instead (H200, session 16, selection at 128K + 100: batch 1 19.3 against 29.6 us, batch 2 25.1
against 29.9; batch 8 52-73 against 47, batch 32 203-293 against 140).

Longer rows would make that quadratic cost prohibitive (16,385 blocks at 1M), so
`_gather_kernel` (grid rows x chunks of CH blocks, before the rank launch) first keeps only the
keys whose top 12 word bits reach the bin T holding the K-th largest (read from the histogram
with one cumsum): every program appends its chunk's kept keys to the row's buffer, reserving the
range with one atomic. For the benchmark's random keys T's bin holds about 500 of the 16,385
blocks at 1M (BENCHMARKS.md, session 14), so the rank launch then compares a few hundred int64
keys (the buffer is in no particular order, so the block-order trick above does not apply).
Every score tied (all in one bin) keeps the whole row: still exact, at ncand^2 / P compares.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from salactl.runtime.ops.pdl import launch_args, pdl_wait
from salactl.runtime.ops.selection.triton_radix import (_pick_digit, _radix_kernel, _score_u, _sort_key,
                                                      radix_constexprs)

# Counter slots per row: [0] the gather buffer's length, [1:4097] the top-12-bit bins (pass 2).
KEPT = tl.constexpr(0)
NCTR = 4097


@triton.jit
def _gather_kernel(seqlen_ptr, word_ptr, ctr_ptr, kept_ptr, s_word, s_kept,
                   HKV: tl.constexpr, BS: tl.constexpr, NCTR: tl.constexpr, K: tl.constexpr,
                   CH: tl.constexpr, SMALL: tl.constexpr, PDL: tl.constexpr = False):
    pdl_wait(PDL)
    r = tl.program_id(0)
    c = tl.program_id(1)
    n = r // HKV
    ncand = (tl.load(seqlen_ptr + n) - 1) // BS + 1           # blocks 0..own are candidates
    b = c * CH + tl.arange(0, CH)
    if (ncand > SMALL) & (c * CH < ncand):
        w = tl.load(word_ptr + r.to(tl.int64) * s_word + b, mask=b < ncand, other=0)
        row_ctr = ctr_ptr + r * NCTR
        # the top-12-bit bin holding the K-th largest word, as prefix << 20
        thr, _ = _pick_digit(tl.load(row_ctr + 1 + tl.arange(0, 4096)), tl.minimum(ncand, K),
                             tl.zeros([], tl.uint32), 20, 4096)
        u = w.to(tl.uint32, bitcast=True) ^ 0x80000000
        keep = (b < ncand) & ((u >> 20) >= (thr >> 20))
        at = tl.atomic_add(row_ctr + KEPT, tl.sum(keep.to(tl.int32), 0), sem="relaxed")
        key = _sort_key(w, b)
        tl.store(kept_ptr + r.to(tl.int64) * s_kept + at + tl.cumsum(keep.to(tl.int32), 0) - 1, key, mask=keep)


@triton.jit
def _count_above(word_row, j0, j1, thr, acc, CT: tl.constexpr):
    """acc [RB, CT] += (u_j > thr[:, None]) over the blocks j in [j0, j1) (whole tiles), the next
    tile's words loaded before this one's compares (one L2 round trip per tile otherwise)."""
    nxt = _score_u(word_row, j0 + tl.arange(0, CT), j0 + tl.arange(0, CT) < j1)
    for t0 in range(j0, j1, CT):
        uj = nxt
        nxt = _score_u(word_row, t0 + CT + tl.arange(0, CT), t0 + CT + tl.arange(0, CT) < j1)
        acc += (uj[None, :] > thr[:, None]).to(tl.int32)
    return acc


@triton.jit
def _rank_words(word_row, ncand, i0, sel_row, K, RB: tl.constexpr, CT: tl.constexpr):
    """Place blocks [i0, i0 + RB) of a short row by their rank among all its words."""
    i = i0 + tl.arange(0, RB)
    ui = _score_u(word_row, i, i < ncand)
    lo = ui - 1                                      # u_j > u_i - 1  <=>  u_j >= u_i (u_i >= 1)
    diag = (i0 // CT) * CT                           # the tile holding blocks i (CT % RB == 0)
    acc = _count_above(word_row, 0, diag, lo, tl.zeros([RB, CT], tl.int32), CT)   # before: ties count
    j = diag + tl.arange(0, CT)
    uj = _score_u(word_row, j, j < ncand)
    acc += (uj[None, :] > tl.where(j[None, :] < i[:, None], lo[:, None], ui[:, None])).to(tl.int32)
    acc = _count_above(word_row, diag + CT, ncand, ui, acc, CT)                   # after: they do not
    rank = tl.sum(acc, 1)
    tl.store(sel_row + rank, i, mask=(i < ncand) & (rank < K))


@triton.jit
def _rank_kept(kept_row, nkept, i0, sel_row, K, RB: tl.constexpr, CT: tl.constexpr):
    """Place kept keys [i0, i0 + RB) (any order in the buffer) by their rank among all kept keys."""
    i = i0 + tl.arange(0, RB)
    ki = tl.load(kept_row + i, mask=i < nkept, other=0)
    acc = tl.zeros([RB, CT], tl.int32)
    for j0 in range(0, nkept, CT):
        j = j0 + tl.arange(0, CT)
        kj = tl.load(kept_row + j, mask=j < nkept, other=-(2 ** 63))
        acc += (kj[None, :] > ki[:, None]).to(tl.int32)
    rank = tl.sum(acc, 1)
    tl.store(sel_row + rank, -1 - ki.to(tl.int32), mask=(i < nkept) & (rank < K))   # low word = 2^32-1-b


@triton.jit
def _rank_kernel(seqlen_ptr, word_ptr, ctr_ptr, kept_ptr, sel_ptr, cnt_ptr,
                 s_word, s_kept, s_seln, s_selh, s_cntn, s_cnth,
                 HKV: tl.constexpr, BS: tl.constexpr, NCTR: tl.constexpr, K: tl.constexpr,
                 RB: tl.constexpr, CT: tl.constexpr, SMALL: tl.constexpr, SHORT: tl.constexpr,
                 PDL: tl.constexpr = False):
    """SHORT: rows of at most SMALL blocks are ranked here too (else triton_radix.py does them)."""
    pdl_wait(PDL)
    r = tl.program_id(0)
    p = tl.program_id(1)
    P = tl.num_programs(1)
    n = r // HKV
    kh = r % HKV
    ncand = (tl.load(seqlen_ptr + n) - 1) // BS + 1
    sel_row = sel_ptr + n * s_seln + kh * s_selh
    if ncand > SMALL:
        if p == 0:
            tl.store(cnt_ptr + n * s_cntn + kh * s_cnth, tl.minimum(ncand, K))
        nkept = tl.load(ctr_ptr + r * NCTR + KEPT)
        for i0 in range(p * RB, nkept, P * RB):
            _rank_kept(kept_ptr + r.to(tl.int64) * s_kept, nkept, i0, sel_row, K, RB, CT)
    elif SHORT:
        if p == 0:
            tl.store(cnt_ptr + n * s_cntn + kh * s_cnth, tl.minimum(ncand, K))
        for i0 in range(p * RB, ncand, P * RB):
            _rank_words(word_ptr + r.to(tl.int64) * s_word, ncand, i0, sel_row, K, RB, CT)


def topk_launch(seq_lens, words, ctr, sel, cnt, hkv: int, block_size: int, K: int, *, small: int,
                chunk: int, rb: int, ct: int, rank_warps: int, short_rows: int, radix_warps: int) -> None:
    """The top-k over pass 2's words [rows, nb_max] int32 and counters [rows * NCTR] int32
    (top-12-bit histogram built, the gather count zero); writes sel [n, Hkv, >= K] (descending
    score, ties -> lower block) and cnt [n, Hkv]. Rows of more than `small` (a power of 2)
    candidate blocks: gathered (only when the table is that wide), then ranked. Shorter rows:
    ranked when the batch has at most `short_rows` rows, else triton_radix.py's one-program
    select (small 0: no row is short). One to three launches, fixed by the shapes (graph-safe)."""
    rows, nb_max = words.shape
    assert ct % rb == 0 and all(v & (v - 1) == 0 for v in (rb, ct, chunk, small))
    long_rows = nb_max > small
    rank_short = rows <= short_rows
    kept = words.new_empty((rows, nb_max) if long_rows else (1, 1), dtype=torch.int64)
    sel_strides = (sel.stride(0), sel.stride(1), cnt.stride(0), cnt.stride(1))
    pdl = launch_args(words.device)
    if not rank_short and small > 0:
        pick = words.new_empty(rows * triton.next_power_of_2(K), dtype=torch.int64)
        _radix_kernel[(rows,)](seq_lens, words, ctr, pick, sel, cnt, words.stride(0), *sel_strides,
                               **radix_constexprs(hkv, block_size, K, small, NCTR), num_warps=radix_warps, **pdl)
    if long_rows:
        _gather_kernel[(rows, triton.cdiv(nb_max, chunk))](
            seq_lens, words, ctr, kept, words.stride(0), kept.stride(0),
            HKV=hkv, BS=block_size, NCTR=NCTR, K=K, CH=chunk, SMALL=small, num_warps=rank_warps, **pdl)
    if long_rows or rank_short:
        # enough programs for a short row or a typical gathered set; larger sets loop
        programs = max(1, triton.cdiv(min(nb_max, max(small if rank_short else 0, 1024)), rb))
        _rank_kernel[(rows, programs)](
            seq_lens, words, ctr, kept, sel, cnt, words.stride(0), kept.stride(0), *sel_strides,
            HKV=hkv, BS=block_size, NCTR=NCTR, K=K, RB=rb, CT=ct, SMALL=small, SHORT=rank_short,
            num_warps=rank_warps, **pdl)

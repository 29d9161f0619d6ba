"""InfLLM-V2 decode selection in two Triton launches, work proportional to each row's length.

Hand-written because the selection runs inside the decode CUDA graph at the static width of the
page table (sized for the longest context) while a row only has `t//B + 1` candidate blocks, and
no library has a graph-safe top-k whose cost follows a length read on the device. Rows are
(query, KV head); the group's query heads form the M dimension of tl.dot.

Bytes floor (sala-9b: Hkv 2, d 128, bf16, stride 16, block 64, 96 selected blocks), one layer:
K1 = windows x Hkv x d x 2 B = 8,191 x 512 B = 4.19 MB at 128K and 65,535 x 512 B = 33.6 MB at
1M (1.0 / 8.0 us at 4.2 TB/s); the selected K/V is 96 x 64 x 2 x 128 x 2 x 2 B = 6.3 MB (1.5 us).
Dense K/V is 134 MB at 128K (32 us) and 1.07 GB at 1M (255 us). Pass 2 recomputes the scores
from K1 (K1 read twice, mostly from L2 the second time).

1. `_lse_kernel` (grid rows x splits): each split walks its share of the row's *visible*
   windows (share computed from seq_lens on the device, so splits past the end do nothing) and
   writes the per-head log-sum-exp of q.K1_j/sqrt(d).
   Split 0 zeroes the row's counters. With FUSE_K1 the split holding the window completed by
   this token first compresses it (mean of its keys) into the K1 pool, so no separate compress
   launch is needed.
2. `_block_topk_kernel` (grid rows x chunks of NBC blocks; chunks past the row's own block exit
   at once): merges the lse, recomputes p_j from K1, sums over the group's heads, max-pools to
   blocks, applies the forced/candidate rules and writes one int64 sort key per block
   (order-preserving score bits high, 2^32-1-b low: "higher score first, ties -> lower index", unique keys).
   The last chunk program of each GROUP-block group to finish (atomic ticket) selects the
   group's top K keys; with several groups, the last group to finish merges the groups' picks.
   The final K keys are written as block ids in descending key order plus the count -- the
   layout paged_attention takes. Top K of a key list = radix select of the K-th largest score
   word (RB bits per round, counts by broadcast compares), ties at that score taken in index
   order by a cumsum, compaction by cumsum positions, final order by tl.sort of the K picks.
   With HIST (topk="hist") there are no groups: each program stores int32 score words (4 B per
   block: 64 KB per row at 1M) and, with HFIRST, adds its blocks to the row's 4096-bin
   histogram of the top 12 word bits (global atomics, next to the row's ticket); the last
   program of the row selects over all its blocks (`_hist_select`): an exact radix select with
   tl.histogram digits. With HFIRST the last program reads the row's words once (1 pass of
   ceil(n/TILE) steps: 4 at 1M with TILE 4096, each 2 cumsums), then 3 digit rounds + 1
   compaction over the few blocks sharing the threshold's 12-bit bin (usually one CTILE step
   each); without, 4 histogram passes + 1 compaction pass over all blocks (20 steps at 1M).
   The radix path instead runs 16 two-bit rounds per 2048-key tile in each of 8 groups, then 16
   more for the merge (~150 synchronised steps on the critical path at 1M). The final order:
   tl.sort of the <= KP picks. With THRESH (topk="thresh", HIST and HFIRST too) nobody selects
   here: triton_thresh.py's third launch spreads the read of the row's words over the grid.
"""

from __future__ import annotations

import triton
import triton.language as tl

from salactl.runtime.ops.selection.triton import _nvis, compress_window, k1_scores

SENTINEL = tl.constexpr(-(2 ** 63))     # "no block": its score word is 0, below every real key


@triton.jit
def _score_word(key):
    """Order-preserving unsigned score word of a key; 0 only for SENTINEL."""
    hi = (key >> 32).to(tl.int32)
    return hi.to(tl.uint32, bitcast=True) ^ 0x80000000


@triton.jit
def _load_q(q_ptr, n, kh, s_qn, s_qh, G: tl.constexpr, BG: tl.constexpr, D: tl.constexpr):
    g = tl.arange(0, BG)
    d = tl.arange(0, D)
    return tl.load(q_ptr + n * s_qn + (kh * G + g)[:, None] * s_qh + d[None, :],
                   mask=(g < G)[:, None], other=0.0)


@triton.jit(do_not_specialize=["num_splits"])
def _lse_kernel(q_ptr, k1_ptr, pt_ptr, slot_ptr, seqlen_ptr, plse_ptr, ctr_ptr,
                k_ptr, jstart_ptr, jcount_ptr, ks_ptr,
                s_qn, s_qh, s_1p, s_1h, s_kp, s_kh, s_pt, sm_scale, num_splits,
                HKV: tl.constexpr, G: tl.constexpr, BG: tl.constexpr, D: tl.constexpr,
                WPP: tl.constexpr, KS: tl.constexpr, ST: tl.constexpr, BS: tl.constexpr,
                BW: tl.constexpr, NCTR: tl.constexpr, NCTR2: tl.constexpr,
                FUSE_K1: tl.constexpr, FP8: tl.constexpr, DOT_F32: tl.constexpr):
    r = tl.program_id(0)
    sp = tl.program_id(1)
    n = r // HKV
    kh = r % HKV
    if sp == 0:
        c = tl.arange(0, NCTR2)
        tl.store(ctr_ptr + r * NCTR + c, tl.zeros([NCTR2], tl.int32), mask=c < NCTR)
    slot = tl.load(slot_ptr + n).to(tl.int64)
    t = tl.load(seqlen_ptr + n) - 1
    nvis = _nvis(t, KS, ST)
    per = tl.cdiv(tl.cdiv(nvis, num_splits), BW) * BW
    start = sp * per
    end = tl.minimum(start + per, nvis)
    if FUSE_K1:
        jn = tl.load(jstart_ptr + n)
        if (tl.load(jcount_ptr + n) > 0) & (jn >= start) & (jn < end):
            compress_window(k_ptr, k1_ptr, pt_ptr, slot, jn, kh, s_kp, s_kh, s_1p, s_1h, s_pt, ks_ptr,
                            BS, ST, KS, D, FP8)
            tl.debug_barrier()              # the loop below reads it back (same program)
    q = _load_q(q_ptr, n, kh, s_qn, s_qh, G, BG, D)
    m = tl.full([BG], -1e30, tl.float32)
    l = tl.zeros([BG], tl.float32)
    for j0 in range(start, end, BW):
        j = j0 + tl.arange(0, BW)
        jm = j < end
        s = k1_scores(q, k1_ptr, pt_ptr, slot, j, jm, kh, s_1p, s_1h, s_pt, WPP, D, DOT_F32)
        s = s * sm_scale
        s = tl.where(jm[None, :], s, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, 1))
        l = l * tl.exp(m - m_new) + tl.sum(tl.exp(s - m_new[:, None]), 1)
        m = m_new
    lse = tl.where(l > 0, m + tl.log(tl.where(l > 0, l, 1.0)), float("-inf"))
    tl.store(plse_ptr + (r * num_splits + sp).to(tl.int64) * BG + tl.arange(0, BG), lse)


@triton.jit
def _select_top(src_ptr, length, scratch_ptr, K: tl.constexpr, KP: tl.constexpr,
                TILE: tl.constexpr, RB: tl.constexpr):
    """The K largest keys of src[0:length) (ascending block order, SENTINEL = none), returned as
    a [KP] tensor in ascending block order padded with SENTINEL. scratch: KP int64 of this
    program's own. Tiles of TILE keys are merged into the running pick one after another."""
    R: tl.constexpr = 1 << RB
    k = tl.arange(0, KP)
    run = tl.full([KP], SENTINEL, tl.int64)
    for t0 in range(0, length, TILE):
        i = t0 + tl.arange(0, TILE)
        x = tl.load(src_ptr + i, mask=i < length, other=SENTINEL, cache_modifier=".cg")
        ux = _score_word(x)
        ur = _score_word(run)
        # radix select: P = largest score word with #(u >= P) >= K (0 when fewer than K keys)
        p = tl.zeros([], tl.uint32)
        dig = tl.arange(0, R).to(tl.uint32)
        for it in tl.static_range(32 // RB):
            trial = p + (dig << (32 - RB * (it + 1)))
            cnt = (tl.sum((ux[None, :] >= trial[:, None]).to(tl.int32), 1)
                   + tl.sum((ur[None, :] >= trial[:, None]).to(tl.int32), 1))
            p = p + (tl.max(tl.where(cnt >= K, dig, 0), 0) << (32 - RB * (it + 1)))
        above_r = ur > p
        above_x = ux > p
        room = K - tl.sum(above_r.to(tl.int32), 0) - tl.sum(above_x.to(tl.int32), 0)
        tie_r = (ur == p) & (ur > 0)
        tie_x = (ux == p) & (ux > 0)
        cr = tl.cumsum(tie_r.to(tl.int32), 0)
        cx = tl.cumsum(tie_x.to(tl.int32), 0) + tl.sum(tie_r.to(tl.int32), 0)
        sel_r = above_r | (tie_r & (cr <= room))      # ties: lower block index first
        sel_x = above_x | (tie_x & (cx <= room))
        nr = tl.sum(sel_r.to(tl.int32), 0)
        pos_r = tl.cumsum(sel_r.to(tl.int32), 0) - 1
        pos_x = tl.cumsum(sel_x.to(tl.int32), 0) - 1 + nr
        nsel = nr + tl.sum(sel_x.to(tl.int32), 0)
        tl.debug_barrier()                            # every thread holds `run` before overwrite
        tl.store(scratch_ptr + pos_r, run, mask=sel_r)
        tl.store(scratch_ptr + pos_x, x, mask=sel_x)
        tl.debug_barrier()
        run = tl.load(scratch_ptr + k, mask=k < nsel, other=SENTINEL)
    return run


@triton.jit
def _unsigned_word(src_ptr, i, m, WIDE: tl.constexpr):
    """(u, key64) of entries i: u = score word ^ 2^31 (unsigned order = score order). WIDE: src
    holds int64 sort keys (word high, 2^32-1-b low) else int32 words of blocks b = i."""
    if WIDE:
        key = tl.load(src_ptr + i, mask=m, other=0, cache_modifier=".cg")
        w = (key >> 32).to(tl.int32)
    else:
        w = tl.load(src_ptr + i, mask=m, other=0, cache_modifier=".cg")
        key = w.to(tl.int64) * 4294967296 + (4294967295 - i.to(tl.int64))
    return w.to(tl.uint32, bitcast=True) ^ 0x80000000, key


@triton.jit
def _digit_hist(src_ptr, length, prefix, SH: tl.constexpr, MSH: tl.constexpr, TILE: tl.constexpr,
                COPIES: tl.constexpr, WIDE: tl.constexpr):
    """[256] counts of digit (u >> SH) & 255 over src[0:length) among the entries whose bits
    >= MSH equal prefix's (MSH 32: all). Bits of the digit at or above MSH are equal in those
    entries, so the digit order is the order of the bits below MSH."""
    h = tl.zeros([256 * COPIES], tl.int32)
    for t0 in range(0, length, TILE):
        i = t0 + tl.arange(0, TILE)
        m = i < length
        u, _ = _unsigned_word(src_ptr, i, m, WIDE)
        if MSH < 32:
            m = m & ((u >> MSH) == (prefix >> MSH))
        bins = ((u >> SH) & 255).to(tl.int32)
        if COPIES > 1:
            bins = bins * COPIES + (i % COPIES)
        h += tl.histogram(bins, 256 * COPIES, mask=m)
    if COPIES > 1:
        return tl.sum(tl.reshape(h, (256, COPIES)), 1)
    else:
        return h


@triton.jit
def _pick_digit(hd, need, prefix, SH: tl.constexpr, NB: tl.constexpr):
    """From the counts hd [NB] of the candidates' digit at SH: the digit d holding the need-th
    largest, the new prefix (prefix | d << SH) and need minus the candidates above d."""
    dig = tl.arange(0, NB)
    ge = tl.sum(hd, 0) - tl.cumsum(hd, 0) + hd                    # candidates with digit >= d
    d = tl.max(tl.where(ge >= need, dig, 0), 0)
    return prefix | (d.to(tl.uint32) << SH), need - tl.sum(tl.where(dig > d, hd, 0), 0)


@triton.jit
def _compact(src_ptr, length, thr, need, scratch_ptr, base, TILE: tl.constexpr, WIDE: tl.constexpr):
    """Append to scratch[base:] (as int64 sort keys, ascending entry order) the entries of
    src[0:length) with u > thr and the first `need` with u == thr; returns the new end."""
    ties = tl.zeros([], tl.int32)
    for t0 in range(0, length, TILE):
        i = t0 + tl.arange(0, TILE)
        m = i < length
        u, key = _unsigned_word(src_ptr, i, m, WIDE)
        tie = m & (u == thr)
        rank = tl.cumsum(tie.to(tl.int32), 0) + ties
        pick = (m & (u > thr)) | (tie & (rank <= need))
        tl.store(scratch_ptr + base + tl.cumsum(pick.to(tl.int32), 0) - 1, key, mask=pick)
        base += tl.sum(pick.to(tl.int32), 0)
        ties += tl.sum(tie.to(tl.int32), 0)
    return base


@triton.jit
def _hist_select(src_ptr, length, scratch_ptr, hist0_ptr, cand_ptr, K: tl.constexpr, KP: tl.constexpr,
                 TILE: tl.constexpr, CTILE: tl.constexpr, COPIES: tl.constexpr, FIRST_DONE: tl.constexpr):
    """The min(K, length) largest blocks of src[0:length) (int32 order-preserving score words,
    ties -> lower block index) as [KP] int64 sort keys (SENTINEL padded, unordered).
    Radix select on u = word ^ 2^31 (unsigned, larger score = larger u) with histograms
    (tl.histogram, 256 bins): round r counts the digit of the candidates (entries whose higher
    bits equal the prefix found so far; masked, the others are not counted) and a cumsum over
    the bins gives the digit holding the `need`-th largest. When the prefix is the whole word it
    is the exact threshold T and `need` how many entries == T to take (lowest indices first).
    Without FIRST_DONE: 4 rounds of 8-bit digits, each one pass over all entries in TILE steps,
    then one compaction pass. With FIRST_DONE: the top 12 bits' 4096-bin histogram is at hist0
    (pass 2's programs built it with global atomics), so one pass over the entries writes those
    above the 12-bit digit to scratch and those in it to cand (int64 keys, index order); the
    rounds for the low 20 bits (digits at 12, 4, 0) and the last compaction run over cand only,
    in CTILE steps (usually one: a 1/8-octave bin holds few blocks; all of them when tied).
    COPIES > 1: bin = digit * COPIES + i % COPIES (lane-private bins: for Triton versions whose
    tl.histogram is one shared atomic per entry; ruinous for the ballot-based lowering)."""
    need = tl.minimum(length, K)
    if FIRST_DONE:
        h1 = tl.load(hist0_ptr + tl.arange(0, 4096), cache_modifier=".cg")
        prefix, need = _pick_digit(h1, need, tl.zeros([], tl.uint32), 20, 4096)
        above = tl.zeros([], tl.int32)
        nc = tl.zeros([], tl.int32)
        for t0 in range(0, length, TILE):
            i = t0 + tl.arange(0, TILE)
            m = i < length
            u, key = _unsigned_word(src_ptr, i, m, False)
            hi = m & ((u >> 20) > (prefix >> 20))
            eq = m & ((u >> 20) == (prefix >> 20))
            tl.store(scratch_ptr + above + tl.cumsum(hi.to(tl.int32), 0) - 1, key, mask=hi)
            tl.store(cand_ptr + nc + tl.cumsum(eq.to(tl.int32), 0) - 1, key, mask=eq)
            above += tl.sum(hi.to(tl.int32), 0)
            nc += tl.sum(eq.to(tl.int32), 0)
        tl.debug_barrier()                      # cand written by every thread, read by all
        prefix, need = _pick_digit(_digit_hist(cand_ptr, nc, prefix, 12, 20, CTILE, COPIES, True),
                                   need, prefix, 12, 256)
        prefix, need = _pick_digit(_digit_hist(cand_ptr, nc, prefix, 4, 12, CTILE, COPIES, True),
                                   need, prefix, 4, 256)
        prefix, need = _pick_digit(_digit_hist(cand_ptr, nc, prefix, 0, 4, CTILE, COPIES, True),
                                   need, prefix, 0, 256)
        base = _compact(cand_ptr, nc, prefix, need, scratch_ptr, above, CTILE, True)
    else:
        prefix = tl.zeros([], tl.uint32)
        prefix, need = _pick_digit(_digit_hist(src_ptr, length, prefix, 24, 32, TILE, COPIES, False),
                                   need, prefix, 24, 256)
        prefix, need = _pick_digit(_digit_hist(src_ptr, length, prefix, 16, 24, TILE, COPIES, False),
                                   need, prefix, 16, 256)
        prefix, need = _pick_digit(_digit_hist(src_ptr, length, prefix, 8, 16, TILE, COPIES, False),
                                   need, prefix, 8, 256)
        prefix, need = _pick_digit(_digit_hist(src_ptr, length, prefix, 0, 8, TILE, COPIES, False),
                                   need, prefix, 0, 256)
        base = _compact(src_ptr, length, prefix, need, scratch_ptr, tl.zeros([], tl.int32), TILE, False)
    tl.debug_barrier()
    k = tl.arange(0, KP)
    return tl.load(scratch_ptr + k, mask=k < base, other=SENTINEL)


@triton.jit
def _write_ranked(run, sel_ptr, cnt_ptr, KP: tl.constexpr):
    """Block ids of the picked keys in descending key order, and their count."""
    nvalid = tl.sum((_score_word(run) > 0).to(tl.int32), 0)
    ranked = tl.sort(run, descending=True)                          # SENTINEL sorts last
    k = tl.arange(0, KP)
    tl.store(sel_ptr + k, -1 - ranked.to(tl.int32), mask=k < nvalid)   # low word = 2^32-1-b
    tl.store(cnt_ptr, nvalid)


@triton.jit(do_not_specialize=["num_splits"])
def _block_topk_kernel(q_ptr, k1_ptr, pt_ptr, slot_ptr, seqlen_ptr, plse_ptr, key_ptr, part_ptr,
                       ctr_ptr, sel_ptr, cnt_ptr, cand_ptr,
                       s_qn, s_qh, s_1p, s_1h, s_pt, s_key, s_seln, s_selh, s_cntn, s_cnth,
                       sm_scale, num_splits,
                       HKV: tl.constexpr, G: tl.constexpr, BG: tl.constexpr, D: tl.constexpr,
                       WPP: tl.constexpr, LEFT: tl.constexpr, KS: tl.constexpr, ST: tl.constexpr,
                       BS: tl.constexpr, NBC: tl.constexpr, GROUP: tl.constexpr,
                       NG_MAX: tl.constexpr, NCTR: tl.constexpr,
                       INIT: tl.constexpr, WINB: tl.constexpr, K: tl.constexpr, KP: tl.constexpr,
                       TILE: tl.constexpr, RB: tl.constexpr, SP2: tl.constexpr,
                       DOT_F32: tl.constexpr, HIST: tl.constexpr, HCOPIES: tl.constexpr,
                       HFIRST: tl.constexpr, CTILE: tl.constexpr, THRESH: tl.constexpr):
    r = tl.program_id(0)
    c = tl.program_id(1)
    n = r // HKV
    kh = r % HKV
    t = tl.load(seqlen_ptr + n) - 1
    own = t // BS
    ncand = own + 1                                   # blocks 0..own are candidates
    b0 = c * NBC
    if b0 < ncand:
        slot = tl.load(slot_ptr + n).to(tl.int64)
        nvis = _nvis(t, KS, ST)
        g = tl.arange(0, BG)
        sp = tl.arange(0, SP2)                        # merge every split's lse at once
        part = tl.load(plse_ptr + ((r * num_splits).to(tl.int64) + sp[:, None]) * BG + g[None, :],
                       mask=(sp < num_splits)[:, None], other=float("-inf"))
        mx = tl.maximum(tl.max(part, 0), -1e30)
        den = tl.sum(tl.exp(part - mx[None, :]), 0)
        lse = tl.where(den > 0, mx + tl.log(tl.where(den > 0, den, 1.0)), 0.0)
        b = b0 + tl.arange(0, NBC)
        pooled = tl.full([NBC], float("-inf"), tl.float32)
        q = _load_q(q_ptr, n, kh, s_qn, s_qh, G, BG, D)
        for w in tl.static_range(WPP + LEFT):
            j = b * WPP - LEFT + w                    # windows overlapping block b
            jm = (j >= 0) & (j < nvis)
            hm = jm[None, :] & (g < G)[:, None]
            s = k1_scores(q, k1_ptr, pt_ptr, slot, j, jm, kh, s_1p, s_1h, s_pt, WPP, D, DOT_F32)
            s = s * sm_scale
            p = tl.where(hm, tl.exp(s - lse[:, None]), 0.0)
            pooled = tl.maximum(pooled, tl.where(jm, tl.sum(p, 0), float("-inf")))
        cand = b < ncand
        forced = (b < INIT) | ((b >= own - WINB) & cand)
        score = tl.where(pooled == float("-inf"), -1.0, pooled)
        score = tl.where(forced, float("inf"), score)
        bits = score.to(tl.int32, bitcast=True)
        ordered = tl.where(bits >= 0, bits, bits ^ 0x7FFFFFFF).to(tl.int64)
        row_keys = key_ptr + r.to(tl.int64) * s_key
        if HIST:                                      # int32 words; the row's last program selects
            word = ordered.to(tl.int32)
            tl.store(row_keys + b, word, mask=cand)
            row_ctr = ctr_ptr + r * NCTR                # [ticket, 4096 top-12-bit bins (HFIRST)]
            if HFIRST:                                  # the top 12 bits' histogram, spread over programs
                top = ((word.to(tl.uint32, bitcast=True) ^ 0x80000000) >> 20).to(tl.int32)
                tl.atomic_add(row_ctr + 1 + top, tl.full([NBC], 1, tl.int32), mask=cand, sem="relaxed")
            if not THRESH:                              # THRESH: _thresh_kernel selects
                tl.debug_barrier()
                if tl.atomic_add(row_ctr, 1) == tl.cdiv(ncand, NBC) - 1:
                    part_row = part_ptr + r.to(tl.int64) * (NG_MAX + 1) * KP
                    run = _hist_select(row_keys, ncand, part_row, row_ctr + 1, cand_ptr + r.to(tl.int64) * s_key,
                                       K, KP, TILE, CTILE, HCOPIES, HFIRST)
                    _write_ranked(run, sel_ptr + n * s_seln + kh * s_selh, cnt_ptr + n * s_cntn + kh * s_cnth,
                                  KP)
        else:
            key = ordered * 4294967296 + (4294967295 - b.to(tl.int64))
            tl.store(row_keys + b, key, mask=cand)
            tl.debug_barrier()                            # all of this program's keys, then the ticket
            grp = b0 // GROUP
            per_group: tl.constexpr = GROUP // NBC
            in_group = tl.minimum(tl.cdiv(ncand, NBC) - grp * per_group, per_group)
            row_ctr = ctr_ptr + r * NCTR
            if tl.atomic_add(row_ctr + grp, 1) == in_group - 1:        # last chunk of the group
                ngroups = tl.cdiv(ncand, GROUP)
                gpart = part_ptr + (r.to(tl.int64) * (NG_MAX + 1) + grp) * KP
                sel = sel_ptr + n * s_seln + kh * s_selh
                cnt = cnt_ptr + n * s_cntn + kh * s_cnth
                glen = tl.minimum(GROUP, ncand - grp * GROUP)
                run = _select_top(row_keys + grp * GROUP, glen, gpart, K, KP, TILE, RB)
                if ngroups == 1:
                    _write_ranked(run, sel, cnt, KP)
                else:
                    tl.store(gpart + tl.arange(0, KP), run)
                    tl.debug_barrier()
                    if tl.atomic_add(row_ctr + NG_MAX, 1) == ngroups - 1:   # last group: merge
                        rpart = part_ptr + r.to(tl.int64) * (NG_MAX + 1) * KP
                        run = _select_top(rpart, ngroups * KP, rpart + NG_MAX * KP, K, KP, TILE, RB)
                        _write_ranked(run, sel, cnt, KP)

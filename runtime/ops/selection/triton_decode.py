"""InfLLM-V2 decode selection's first two Triton launches (the third, the top-k, is in
triton_rank.py / triton_radix.py), work proportional to each row's length.

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
   writes the per-head log-sum-exp of q.K1_j/sqrt(d). With ELEM (the default) it keeps
   one online softmax per (head, window slot of the step) and merges the slots once at the end:
   no row max and sum across the warps at every step (1M b1 about 1 us faster).
   Split 0 zeroes the row's counters. With FUSE_K1 the last split only compresses the window
   completed by this token (mean of its keys) into the K1 pool and writes that window's score as
   its partial lse; the other splits share the rest of the windows. So no separate compress launch
   is needed, and no split waits on the compress before its own windows (1M b1 about 1 us faster
   warm: BENCHMARKS.md, "Tuning notes moved from code comments").
2. `_block_words_kernel` (grid rows x chunks of NBC blocks; chunks past the row's own block exit
   at once): recomputes the scores q.K1_j -- with EARLY before its PDL wait, so they overlap
   the lse pass (only the chunk holding the window that pass compresses reads K1 after it) --
   then merges the lse, turns the scores into p_j, sums over the group's heads, max-pools to
   blocks, applies the forced/candidate rules and stores one int32 order-preserving score word
   per block (4 B per block: 64 KB per row at 1M), adding its blocks to the row's 4096-bin
   histogram of the word's top 12 bits (global atomics in the row's counter slots; DEDUP: one
   per distinct bin of the program, as scores crowd into a few bins). Nobody
   selects here: triton_rank.topk_launch finds the top K from the histogram and the
   words, spread over the grid (keys "higher score first, ties -> lower block index").
"""

from __future__ import annotations

import triton
import triton.language as tl

from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from salactl.runtime.ops.pdl import pdl_wait
from salactl.runtime.ops.selection.triton import _nvis, compress_window, k1_scores

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
                BW: tl.constexpr, ELEM: tl.constexpr, NCTR: tl.constexpr, NCTR2: tl.constexpr,
                FUSE_K1: tl.constexpr, FP8: tl.constexpr, DOT_F32: tl.constexpr, PDL: tl.constexpr = False):
    pdl_wait(PDL)
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
    g = tl.arange(0, BG)
    jnew = -1                               # FUSE_K1: the window this token completes, if any
    if FUSE_K1:                             # (always nvis - 1: select_decode's contract)
        jnew = tl.where(tl.load(jcount_ptr + n) > 0, tl.load(jstart_ptr + n), -1)
    if (sp == num_splits - 1) and FUSE_K1:
        # the compress split: K1_jnew into the pool, and its score as a partial lse of its own,
        # beside the other splits (which leave that window out) instead of ahead of one of them
        lse = tl.full([BG], float("-inf"), tl.float32)
        if jnew >= 0:
            k1 = compress_window(k_ptr, k1_ptr, pt_ptr, slot, jnew, kh, s_kp, s_kh, s_1p, s_1h, s_pt, ks_ptr,
                                 BS, ST, KS, D, FP8)
            q = _load_q(q_ptr, n, kh, s_qn, s_qh, G, BG, D)
            row = tl.arange(0, 16)                          # K1_jnew as row 0 of an MMA tile
            kt = tl.where((row == 0)[:, None], k1[None, :], tl.zeros_like(k1)[None, :])
            if DOT_F32:
                s = tl.dot(q, tl.trans(kt), input_precision="ieee")
            else:
                s = tl.dot(q, tl.trans(kt))
            lse = tl.sum(tl.where((row == 0)[None, :], s, 0.0), 1) * sm_scale
    else:
        # jnew is the last visible window (the one this token completes): the others share the rest
        # (a mask for jnew instead cost the loop 32 registers and pass 2 its place beside this pass)
        nreg = num_splits - 1 if FUSE_K1 else num_splits
        nv = nvis
        if FUSE_K1:
            nv = nvis - (jnew >= 0).to(tl.int32)
        per = tl.cdiv(tl.cdiv(nv, nreg), BW) * BW       # whole steps of BW windows per split
        start = sp * per
        end = tl.minimum(start + per, nv)
        q = _load_q(q_ptr, n, kh, s_qn, s_qh, G, BG, D)
        if ELEM:
            # one online softmax per (head, window slot): no reduction across lanes and warps (nor
            # its barriers) per step, one EX2 more per score; the slots are merged once at the end
            me = tl.full([BG, BW], -1e30, tl.float32)
            le = tl.zeros([BG, BW], tl.float32)
        else:
            m = tl.full([BG], -1e30, tl.float32)
            l = tl.zeros([BG], tl.float32)
        for j0 in range(start, end, BW):
            j = j0 + tl.arange(0, BW)
            jm = j < end
            s = k1_scores(q, k1_ptr, pt_ptr, slot, j, jm, kh, s_1p, s_1h, s_pt, WPP, D, DOT_F32)
            # m and s in log2 units: one FMUL and one EX2 per score (tl.exp adds an FMUL by log2 e)
            s = s * (sm_scale * 1.4426950408889634)
            s = tl.where(jm[None, :], s, float("-inf"))
            if ELEM:
                me_new = tl.maximum(me, s)
                le = le * tl.exp2(me - me_new) + tl.exp2(s - me_new)
                me = me_new
            else:
                m_new = tl.maximum(m, tl.max(s, 1))
                l = l * tl.exp2(m - m_new) + tl.sum(tl.exp2(s - m_new[:, None]), 1)
                m = m_new
        if ELEM:
            m = tl.max(me, 1)
            l = tl.sum(le * tl.exp2(me - m[:, None]), 1)
        lse = tl.where(l > 0, (m + tl.log2(tl.where(l > 0, l, 1.0))) * 0.6931471805599453, float("-inf"))
    tl.store(plse_ptr + (r * num_splits + sp).to(tl.int64) * BG + g, lse)


@triton.jit
def _merged_lse(plse_ptr, r, num_splits, g, BG: tl.constexpr, SP2: tl.constexpr):
    """The row's per-head log-sum-exp from the lse pass's splits, merged at once: [BG]."""
    sp = tl.arange(0, SP2)
    part = tl.load(plse_ptr + ((r * num_splits).to(tl.int64) + sp[:, None]) * BG + g[None, :],
                   mask=(sp < num_splits)[:, None], other=float("-inf"))
    mx = tl.maximum(tl.max(part, 0), -1e30)
    den = tl.sum(tl.exp(part - mx[None, :]), 0)
    return tl.where(den > 0, mx + tl.log(tl.where(den > 0, den, 1.0)), 0.0)


@triton.jit
def _window_mask(b, w, nvis, WPP: tl.constexpr, LEFT: tl.constexpr):
    """Whether window b·WPP - LEFT + w (the w-th window overlapping block b) is visible."""
    j = b * WPP - LEFT + w
    return (j >= 0) & (j < nvis)


@triton.jit
def _pool_window(pooled, s, jm, lse, g, sm_scale, G: tl.constexpr):
    """Max-pool one window per block: raw scores s [BG, NBC] -> sum over the group's heads of
    exp(s·sm_scale - lse), taken where jm (visible) holds."""
    hm = jm[None, :] & (g < G)[:, None]
    p = tl.where(hm, tl.exp(s * sm_scale - lse[:, None]), 0.0)
    return tl.maximum(pooled, tl.where(jm, tl.sum(p, 0), float("-inf")))


@triton.jit(do_not_specialize=["num_splits"])
def _block_words_kernel(q_ptr, k1_ptr, pt_ptr, slot_ptr, seqlen_ptr, plse_ptr, word_ptr, ctr_ptr,
                        jstart_ptr, jcount_ptr,
                        s_qn, s_qh, s_1p, s_1h, s_pt, s_word, sm_scale, num_splits,
                        HKV: tl.constexpr, G: tl.constexpr, BG: tl.constexpr, D: tl.constexpr,
                        WPP: tl.constexpr, LEFT: tl.constexpr, KS: tl.constexpr, ST: tl.constexpr,
                        BS: tl.constexpr, NBC: tl.constexpr, NCTR: tl.constexpr,
                        INIT: tl.constexpr, WINB: tl.constexpr, SP2: tl.constexpr, DOT_F32: tl.constexpr,
                        DEDUP: tl.constexpr = False, EARLY: tl.constexpr = False, FUSE_K1: tl.constexpr = False,
                        PDL: tl.constexpr = False):
    # EARLY (under PDL): the K1 scores before the wait, overlapping the lse pass; only the lse
    # partials, the counters and the K1 window the lse pass compresses (FUSE_K1) are its writes
    EW: tl.constexpr = EARLY and PDL
    if not EW:
        pdl_wait(PDL)
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
        if EARLY:
            b = b0 + tl.arange(0, NBC)
            q = _load_q(q_ptr, n, kh, s_qn, s_qh, G, BG, D)
            late = False
            if EW:
                if FUSE_K1:   # this chunk reads the window being compressed: its scores after the wait
                    jn = tl.load(jstart_ptr + n)
                    late = (tl.load(jcount_ptr + n) > 0) & (jn >= b0 * WPP - LEFT) & (jn < (b0 + NBC) * WPP)
                    if late:
                        gdc_wait()
            scores = ()
            for w in tl.static_range(WPP + LEFT):
                j = b * WPP - LEFT + w                # windows overlapping block b
                jm = _window_mask(b, w, nvis, WPP, LEFT)
                scores = scores + (k1_scores(q, k1_ptr, pt_ptr, slot, j, jm, kh, s_1p, s_1h, s_pt, WPP, D, DOT_F32),)
            if EW:
                if not late:
                    gdc_wait()
                gdc_launch_dependents()
            lse = _merged_lse(plse_ptr, r, num_splits, g, BG, SP2)
            pooled = tl.full([NBC], float("-inf"), tl.float32)
            for w in tl.static_range(WPP + LEFT):
                jm = _window_mask(b, w, nvis, WPP, LEFT)
                pooled = _pool_window(pooled, scores[w], jm, lse, g, sm_scale, G)
        else:
            # this order (lse merge, then q) keeps 146 registers at 2 warps (q first took 154
            # and pass 2 at 1M from 13.4 to 18 us)
            lse = _merged_lse(plse_ptr, r, num_splits, g, BG, SP2)
            b = b0 + tl.arange(0, NBC)
            pooled = tl.full([NBC], float("-inf"), tl.float32)
            q = _load_q(q_ptr, n, kh, s_qn, s_qh, G, BG, D)
            for w in tl.static_range(WPP + LEFT):
                j = b * WPP - LEFT + w                # windows overlapping block b
                jm = _window_mask(b, w, nvis, WPP, LEFT)
                s = k1_scores(q, k1_ptr, pt_ptr, slot, j, jm, kh, s_1p, s_1h, s_pt, WPP, D, DOT_F32)
                pooled = _pool_window(pooled, s, jm, lse, g, sm_scale, G)
        cand = b < ncand
        forced = (b < INIT) | ((b >= own - WINB) & cand)
        score = tl.where(pooled == float("-inf"), -1.0, pooled)
        score = tl.where(forced, float("inf"), score)
        bits = score.to(tl.int32, bitcast=True)
        word = tl.where(bits >= 0, bits, bits ^ 0x7FFFFFFF)
        tl.store(word_ptr + r.to(tl.int64) * s_word + b, word, mask=cand)
        top = ((word.to(tl.uint32, bitcast=True) ^ 0x80000000) >> 20).to(tl.int32)
        if DEDUP:
            # one atomic per distinct bin of this program's blocks, adding its count, from the
            # bin's first block: scores crowd into a few bins, whose atomics otherwise serialise
            top = tl.where(cand, top, -1)
            same = top[:, None] == top[None, :]                       # [NBC, NBC]
            i = tl.arange(0, NBC)
            count = tl.sum(same.to(tl.int32), 1)
            first = tl.sum((same & (i[None, :] < i[:, None])).to(tl.int32), 1) == 0
            tl.atomic_add(ctr_ptr + r * NCTR + 1 + top, count, mask=cand & first, sem="relaxed")
        else:
            tl.atomic_add(ctr_ptr + r * NCTR + 1 + top, tl.full([NBC], 1, tl.int32), mask=cand, sem="relaxed")

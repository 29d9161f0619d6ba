"""Decode selection's lse and score-word passes as one launch whose programs all run at once
(`one_pass` in gpu.py): K1 is read once. Replaces triton_decode.py's `_lse_kernel` +
`_block_words_kernel` where the grid fits the GPU at once (batch 1 at 1M context); the top-k
after it is unchanged (triton_rank.py / triton_radix.py).

Program (row, chunk of NBC blocks): its K1 scores q.K1_j for the windows overlapping its blocks
stay in registers; its share of each head's log-sum-exp (the windows that start in its blocks,
so every window of the row counts once) goes to the row's partials; a barrier per row, whose
last arrival merges the partials into the row's lse and zeroes the row's top-k counters; then
every program pools its scores into block words as pass 2 does (`_store_words`).

Hand-written for triton_decode.py's reason; the barrier (grid_barrier.py) is sound only when the
whole grid is resident, which the launcher checks from the compiled kernel. Session 13's one-launch
form (lse split, barrier, then the words re-reading K1 chunk after chunk) lost to the two passes;
this one keeps the scores instead of reading K1 again. The Triton interpreter runs programs one
after another and can never pass a barrier: the two passes serve it.
"""

from __future__ import annotations

import triton
import triton.language as tl

from salactl.runtime.ops.pdl import pdl_wait
from salactl.runtime.ops.selection.triton import _nvis, compress_window, k1_scores
from salactl.runtime.ops.selection.triton_decode import _load_q, _pool_window, _store_words, _window_mask


@triton.jit
def _merge_partials(part_row, nch, g, BG: tl.constexpr, CM: tl.constexpr):
    """The row's per-head lse [BG] from its chunks' (max, sum of exp) partials, CM at a time."""
    mx = tl.full([BG], -1e30, tl.float32)
    den = tl.zeros([BG], tl.float32)
    for c0 in range(0, nch, CM):
        cc = c0 + tl.arange(0, CM)
        live = (cc < nch)[:, None]
        pm = tl.load(part_row + cc[:, None] * (2 * BG) + g[None, :], mask=live, other=-1e30, cache_modifier=".cg")
        pl = tl.load(part_row + cc[:, None] * (2 * BG) + BG + g[None, :], mask=live, other=0.0, cache_modifier=".cg")
        m_new = tl.maximum(mx, tl.max(pm, 0))
        den = den * tl.exp(mx - m_new) + tl.sum(pl * tl.exp(pm - m_new[None, :]), 0)
        mx = m_new
    return tl.where(den > 0, mx + tl.log(tl.where(den > 0, den, 1.0)), 0.0)


@triton.jit
def _one_pass_kernel(q_ptr, k1_ptr, pt_ptr, slot_ptr, seqlen_ptr, part_ptr, lse_ptr, word_ptr, ctr_ptr, bar_ptr,
                     k_ptr, jstart_ptr, jcount_ptr, ks_ptr,
                     s_qn, s_qh, s_1p, s_1h, s_kp, s_kh, s_pt, s_word, sm_scale,
                     HKV: tl.constexpr, G: tl.constexpr, BG: tl.constexpr, D: tl.constexpr,
                     WPP: tl.constexpr, LEFT: tl.constexpr, KS: tl.constexpr, ST: tl.constexpr,
                     BS: tl.constexpr, NBC: tl.constexpr, NCTR: tl.constexpr, NCTR2: tl.constexpr,
                     INIT: tl.constexpr, WINB: tl.constexpr, CM: tl.constexpr,
                     FUSE_K1: tl.constexpr, FP8: tl.constexpr, DOT_F32: tl.constexpr,
                     DEDUP: tl.constexpr = False, PDL: tl.constexpr = False):
    """Grid rows x chunks; part [rows, chunks, 2, BG] fp32, lse [rows, BG] fp32 (scratch);
    bar: grid_barrier.barrier_counters (count, flag per row)."""
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
        nch = tl.cdiv(ncand, NBC)                     # the row's live programs (barrier arrivals)
        slot = tl.load(slot_ptr + n).to(tl.int64)
        nvis = _nvis(t, KS, ST)
        g = tl.arange(0, BG)
        b = b0 + tl.arange(0, NBC)
        if FUSE_K1:
            # every chunk reading the window this token completes compresses it itself (identical
            # values from each), so none reads it before it is written
            jn = tl.load(jstart_ptr + n)
            if (tl.load(jcount_ptr + n) > 0) & (jn >= b0 * WPP - LEFT) & (jn < (b0 + NBC) * WPP):
                compress_window(k_ptr, k1_ptr, pt_ptr, slot, jn, kh, s_kp, s_kh, s_1p, s_1h, s_pt, ks_ptr,
                                BS, ST, KS, D, FP8)
                tl.debug_barrier()
        q = _load_q(q_ptr, n, kh, s_qn, s_qh, G, BG, D)
        scores = ()
        for w in tl.static_range(WPP + LEFT):
            j = b * WPP - LEFT + w                    # windows overlapping block b
            jm = _window_mask(b, w, nvis, WPP, LEFT)
            scores = scores + (k1_scores(q, k1_ptr, pt_ptr, slot, j, jm, kh, s_1p, s_1h, s_pt, WPP, D, DOT_F32),)
        # this chunk's share of the lse: windows b·WPP .. b·WPP + WPP - 1 (those starting in its blocks)
        m = tl.full([BG], -1e30, tl.float32)
        l = tl.zeros([BG], tl.float32)
        for w in tl.static_range(LEFT, WPP + LEFT):
            jm = _window_mask(b, w, nvis, WPP, LEFT)
            s = tl.where(jm[None, :], scores[w] * sm_scale, float("-inf"))
            m_new = tl.maximum(m, tl.max(s, 1))
            l = l * tl.exp(m - m_new) + tl.sum(tl.exp(s - m_new[:, None]), 1)
            m = m_new
        part_row = part_ptr + (r * tl.num_programs(1)).to(tl.int64) * (2 * BG)
        tl.store(part_row + c * (2 * BG) + g, m)
        tl.store(part_row + c * (2 * BG) + BG + g, l)
        # barrier per row (grid_barrier.row_barrier, with the last arrival's merge inside it)
        cnt_ptr = bar_ptr + 2 * r
        flag_ptr = bar_ptr + 2 * r + 1
        tl.debug_barrier()                            # every warp's stores issued before the release
        flag0 = tl.atomic_add(flag_ptr, 0, sem="acquire")
        if tl.atomic_add(cnt_ptr, 1, sem="acq_rel") == nch - 1:
            tl.store(lse_ptr + r * BG + g, _merge_partials(part_row, nch, g, BG, CM))
            cz = tl.arange(0, NCTR2)
            tl.store(ctr_ptr + r * NCTR + cz, tl.zeros([NCTR2], tl.int32), mask=cz < NCTR)
            tl.debug_barrier()
            tl.atomic_xchg(cnt_ptr, 0, sem="relaxed")
            tl.atomic_add(flag_ptr, 1, sem="release")
        else:
            cur = tl.atomic_add(flag_ptr, 0, sem="acquire")
            while cur == flag0:
                cur = tl.atomic_add(flag_ptr, 0, sem="acquire")
        tl.debug_barrier()
        lse = tl.load(lse_ptr + r * BG + g, cache_modifier=".cg")
        pooled = tl.full([NBC], float("-inf"), tl.float32)
        for w in tl.static_range(WPP + LEFT):
            jm = _window_mask(b, w, nvis, WPP, LEFT)
            pooled = _pool_window(pooled, scores[w], jm, lse, g, sm_scale, G)
        _store_words(pooled, b, ncand, own, word_ptr + r.to(tl.int64) * s_word, ctr_ptr + r * NCTR + 1,
                     NBC, INIT, WINB, DEDUP)
    elif c == 0:                                      # an empty row: its counters still start at zero
        cz = tl.arange(0, NCTR2)
        tl.store(ctr_ptr + r * NCTR + cz, tl.zeros([NCTR2], tl.int32), mask=cz < NCTR)


def one_pass_constexprs(words_const: dict, fuse: bool, fp8: bool, nctr: int) -> dict:
    """`_one_pass_kernel`'s compile-time arguments from pass 2's (gpu.words_constexprs)."""
    keep = ("HKV", "G", "BG", "D", "WPP", "LEFT", "KS", "ST", "BS", "NBC", "NCTR", "INIT", "WINB", "DOT_F32", "DEDUP")
    return dict({k: words_const[k] for k in keep}, NCTR2=triton.next_power_of_2(nctr), CM=64,
                FUSE_K1=fuse, FP8=fp8)

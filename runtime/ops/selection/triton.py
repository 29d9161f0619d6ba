"""InfLLM-V2 selection kernels (Triton) over paged compressed keys, exactly DESIGN.md §2.

Hand-written because the selection must run at static shapes inside a CUDA graph and read the
compressed keys through the page table (no library does this). K1 lives in a pool
[num_pages, Hkv, WPP, D] next to the KV pages: window j (tokens [j·st, j·st+ks)) is stored in the
page holding its first token, at slot j % WPP (WPP = block/stride windows start in each page).

1. `_compress_kernel`: K1_j = mean of the window's keys (fp32 mean, stored in K1's dtype).
2. `_score_lse_kernel`: per (query, head) log-sum-exp of q·K1_j/√d over visible windows
   (split over windows; each split writes its lse).
3. `_block_score_kernel`: merges those lse, recomputes p_j = softmax, sums over the group's
   heads, max-pools to blocks, applies the candidate/forced rules and writes an int64 sort key
   per block: order-preserving float bits in the high word, (2³²-1-b) in the low word, so a
   plain top-k yields "higher score first, ties -> lower block index" with unique keys.
Rows of the M tile are (query, head) pairs: QG queries of one sequence × the padded group.
"""

from __future__ import annotations

import triton
import triton.language as tl

from salactl.runtime.ops.pdl import pdl_wait


@triton.jit
def _compress_kernel(k_ptr, k1_ptr, pt_ptr, slot_ptr, start_ptr, count_ptr,
                     s_kp, s_kh, s_1p, s_1h, s_pt, ks_ptr,
                     BS: tl.constexpr, ST: tl.constexpr, KS: tl.constexpr, D: tl.constexpr,
                     FP8: tl.constexpr, PDL: tl.constexpr = False):
    pdl_wait(PDL)
    c = tl.program_id(0)                  # window index first: up to 2^31-1 programs on axis 0
    e = tl.program_id(1)
    h = tl.program_id(2)
    if c < tl.load(count_ptr + e):
        slot = tl.load(slot_ptr + e).to(tl.int64)
        compress_window(k_ptr, k1_ptr, pt_ptr, slot, tl.load(start_ptr + e) + c, h, s_kp, s_kh, s_1p, s_1h,
                        s_pt, ks_ptr, BS, ST, KS, D, FP8)


@triton.jit
def k1_scores(q, k1_ptr, pt_ptr, slot, j, jm, kh, s_1p, s_1h, s_pt,
              WPP: tl.constexpr, D: tl.constexpr, DOT_F32: tl.constexpr):
    """q [M, D] · K1_jᵀ of KV head kh for windows j (where jm is false K1 reads as 0): [M, len(j)]."""
    d = tl.arange(0, D)
    page = tl.load(pt_ptr + slot * s_pt + j // WPP, mask=jm, other=0).to(tl.int64)
    k1 = tl.load(k1_ptr + page[:, None] * s_1p + kh * s_1h + (j % WPP)[:, None] * D + d[None, :],
                 mask=jm[:, None], other=0.0)
    if DOT_F32:
        s = tl.dot(q, tl.trans(k1), input_precision="ieee")
    else:
        s = tl.dot(q, tl.trans(k1))
    return s


@triton.jit
def compress_window(k_ptr, k1_ptr, pt_ptr, slot, j, h, s_kp, s_kh, s_1p, s_1h, s_pt, ks_ptr,
                    BS: tl.constexpr, ST: tl.constexpr, KS: tl.constexpr, D: tl.constexpr, FP8: tl.constexpr):
    """K1_j of KV head h = fp32 mean of keys [j·ST, j·ST+KS), stored in the page of its first token
    (and returned, [D] in the K1 dtype)."""
    tok = j * ST + tl.arange(0, KS)
    d = tl.arange(0, D)
    page = tl.load(pt_ptr + slot * s_pt + tok // BS).to(tl.int64)
    keys = tl.load(k_ptr + page[:, None] * s_kp + h * s_kh + (tok % BS)[:, None] * D + d[None, :])
    keys = keys.to(tl.float32)
    if FP8:
        keys = keys * tl.load(ks_ptr + h)
    mean = tl.sum(keys, axis=0) / KS
    first = j * ST
    dst_page = tl.load(pt_ptr + slot * s_pt + first // BS).to(tl.int64)
    k1 = mean.to(k1_ptr.dtype.element_ty)
    tl.store(k1_ptr + dst_page * s_1p + h * s_1h + ((first % BS) // ST) * D + d, k1)
    return k1


@triton.jit
def _load_q(q_ptr, n, grp, s_qn, s_qh, kh, QG: tl.constexpr, BG: tl.constexpr, G: tl.constexpr,
            D: tl.constexpr):
    mrow = tl.arange(0, QG * BG)
    qi = grp * QG + mrow // BG
    gg = mrow % BG
    valid = (qi < n) & (gg < G)
    d = tl.arange(0, D)
    q = tl.load(q_ptr + qi[:, None] * s_qn + (kh * G + gg)[:, None] * s_qh + d[None, :],
                mask=valid[:, None], other=0.0)
    return q, qi, valid


@triton.jit
def _nvis(t, KS: tl.constexpr, ST: tl.constexpr):
    """Visible windows for a query at position t: j·st + ks - 1 <= t."""
    return tl.where(t >= KS - 1, (t - KS + 1) // ST + 1, 0)


@triton.jit(do_not_specialize=["n", "num_splits"])
def _score_lse_kernel(q_ptr, k1_ptr, pt_ptr, slot_ptr, seqlen_ptr, plse_ptr,
                      n, s_qn, s_qh, s_1p, s_1h, s_pt, sm_scale, num_splits,
                      HKV: tl.constexpr, G: tl.constexpr, BG: tl.constexpr, QG: tl.constexpr,
                      D: tl.constexpr, WPP: tl.constexpr, KS: tl.constexpr, ST: tl.constexpr,
                      BW: tl.constexpr, DOT_F32: tl.constexpr):
    r = tl.program_id(0)
    sp = tl.program_id(1)
    grp = r // HKV
    kh = r % HKV
    q, qi, valid = _load_q(q_ptr, n, grp, s_qn, s_qh, kh, QG, BG, G, D)
    slot = tl.load(slot_ptr + grp * QG).to(tl.int64)
    t = tl.load(seqlen_ptr + qi, mask=qi < n, other=0) - 1
    nvis = tl.where(qi < n, _nvis(t, KS, ST), 0)
    nmax = tl.max(nvis, 0)
    per = tl.cdiv(tl.cdiv(nmax, num_splits), BW) * BW
    start = sp * per
    end = tl.minimum(start + per, nmax)
    m = tl.full([QG * BG], -1e30, tl.float32)
    l = tl.zeros([QG * BG], tl.float32)
    for j0 in range(start, end, BW):
        j = j0 + tl.arange(0, BW)
        jm = j < end
        s = k1_scores(q, k1_ptr, pt_ptr, slot, j, jm, kh, s_1p, s_1h, s_pt, WPP, D, DOT_F32)
        s = tl.where(j[None, :] < nvis[:, None], s * sm_scale, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, 1))
        l = l * tl.exp(m - m_new) + tl.sum(tl.exp(s - m_new[:, None]), 1)
        m = m_new
    lse = tl.where(l > 0, m + tl.log(tl.where(l > 0, l, 1.0)), float("-inf"))
    tl.store(plse_ptr + (r * num_splits + sp).to(tl.int64) * (QG * BG) + tl.arange(0, QG * BG), lse)


@triton.jit(do_not_specialize=["n", "nb_max", "num_splits"])
def _block_score_kernel(q_ptr, k1_ptr, pt_ptr, slot_ptr, seqlen_ptr, plse_ptr, key_ptr,
                        n, nb_max, s_qn, s_qh, s_1p, s_1h, s_pt, s_keyn, s_keyh, sm_scale, num_splits,
                        HKV: tl.constexpr, G: tl.constexpr, BG: tl.constexpr, QG: tl.constexpr,
                        D: tl.constexpr, WPP: tl.constexpr, LEFT: tl.constexpr, KS: tl.constexpr,
                        ST: tl.constexpr, BS: tl.constexpr, NB: tl.constexpr,
                        INIT: tl.constexpr, WINB: tl.constexpr, DOT_F32: tl.constexpr,
                        SP2: tl.constexpr):
    r = tl.program_id(0)
    bt = tl.program_id(1)
    grp = r // HKV
    kh = r % HKV
    M: tl.constexpr = QG * BG
    slot = tl.load(slot_ptr + grp * QG).to(tl.int64)
    b = bt * NB + tl.arange(0, NB)
    qv = grp * QG + tl.arange(0, QG)                       # this program's queries
    tq = tl.load(seqlen_ptr + qv, mask=qv < n, other=1) - 1
    own = tq // BS
    cand = b[None, :] <= own[:, None]                      # [QG, NB]
    pooled = tl.full([QG, NB], float("-inf"), tl.float32)
    if bt * NB <= tl.max(own, 0):
        q, qi, valid = _load_q(q_ptr, n, grp, s_qn, s_qh, kh, QG, BG, G, D)
        t = tl.load(seqlen_ptr + qi, mask=qi < n, other=0) - 1
        nvis = tl.where(qi < n, _nvis(t, KS, ST), 0)
        nmax = tl.max(nvis, 0)
        mrow = tl.arange(0, M)
        sp = tl.arange(0, SP2)                       # merge every split's lse at once
        part = tl.load(plse_ptr + ((r * num_splits).to(tl.int64) + sp[:, None]) * M + mrow[None, :],
                       mask=(sp < num_splits)[:, None], other=float("-inf"))
        m = tl.maximum(tl.max(part, 0), -1e30)
        den = tl.sum(tl.exp(part - m[None, :]), 0)
        lse = tl.where(den > 0, m + tl.log(tl.where(den > 0, den, 1.0)), 0.0)
        nvis_q = tl.where(qv < n, _nvis(tq, KS, ST), 0)     # [QG]
        for w in tl.static_range(WPP + LEFT):
            j = b * WPP - LEFT + w                          # [NB]
            jm = (j >= 0) & (j < nmax)
            s = k1_scores(q, k1_ptr, pt_ptr, slot, j, jm, kh, s_1p, s_1h, s_pt, WPP, D, DOT_F32)
            vis = (j[None, :] < nvis[:, None]) & (j[None, :] >= 0) & valid[:, None]
            p = tl.where(vis, tl.exp(s * sm_scale - lse[:, None]), 0.0)          # [M, NB]
            s_q = tl.sum(tl.reshape(p, (QG, BG, NB)), axis=1)                    # [QG, NB]
            vis_q = (j[None, :] < nvis_q[:, None]) & (j[None, :] >= 0)
            pooled = tl.maximum(pooled, tl.where(vis_q, s_q, float("-inf")))
    score = tl.where(pooled == float("-inf"), -1.0, pooled)
    forced = (b[None, :] < INIT) | ((b[None, :] >= own[:, None] - WINB) & cand)
    score = tl.where(forced, float("inf"), score)
    score = tl.where(cand, score, float("-inf"))
    bits = score.to(tl.int32, bitcast=True)
    ordered = tl.where(bits >= 0, bits, bits ^ 0x7FFFFFFF).to(tl.int64)
    key = ordered * 4294967296 + (4294967295 - b[None, :].to(tl.int64))
    tl.store(key_ptr + qv[:, None].to(tl.int64) * s_keyn + kh * s_keyh + b[None, :], key,
             mask=(qv < n)[:, None] & (b < nb_max)[None, :])

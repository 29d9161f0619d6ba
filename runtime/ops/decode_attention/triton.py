"""Split-K paged decode attention in Triton (flash-decoding over 64-token head-major pages).

Hand-written because no installed library does paged GQA decode over an arbitrary per-row
*block list* (dense = every block, sparse = the InfLLM-V2 selection) with static shapes that a
CUDA graph can capture. Rows are (query token, KV head); the group's query heads form the M
dimension of the tile (padded to 16 for tl.dot). Each split walks a contiguous range of the
row's list with an fp32 online softmax and writes (o, lse); a second kernel merges the splits by
log-sum-exp. The last partial page is masked by the row's sequence length. FP8 (e4m3/e5m2) pages
are converted in the kernel (exactly, to fp16: the MMA then runs in fp16 with the query rounded
to fp16 once, which has more mantissa than bf16) and their per-head fp32 scales multiply the
scores (K) and the output (V), so no per-element scaling is done. FP8 V pages are token-minor
(reference.py says why): offline sm_90 SASS of one page's step went from 939 to 739 instructions
per thread, the 128 one-byte shared loads of V gone. Reference: reference.py beside this.

How many splits, warps and stages the split kernel runs with comes from config.py's DEFAULT_CONFIGS
(per KV dtype), set from benchmarks/decode_attention_bench.py. DecodeConfig.tma loads whole pages
by TMA copies (one per page and operand): the bf16 default; no gain for FP8 pages.
Variants measured slower and not kept (multi-page steps, two token groups per step, streaming
before the PDL wait, e4m3 / e5m2 pages converted without cvt, transposed page math, FP8 tensor
cores): BENCHMARKS.md, "Tuning notes moved from code comments", `runtime/ops/decode_attention/triton.py`.
DecodeConfig.preload loads a split's page ids before its loop (see _split_kernel): with the page
id loaded inside the loop, Triton's pipeliner keeps one K/V buffer, so a page's loads wait for the
previous page's math.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from salactl.runtime.ops.decode_attention.config import DecodeConfig, default_config
from salactl.runtime.ops.decode_attention.reference import is_fp8, v_token_minor
from salactl.runtime.ops.pdl import is_sm90, launch_args, pdl_wait

DENSE_ONLY = 2 ** 31 - 1


@triton.jit
def _attend_page(q, k_ptr, v_ptr, k_desc, v_desc, kbase, vbase, tile, vtile, tok, nvalid, qk_scale, m, l, acc,
                 SUB: tl.constexpr, FP8: tl.constexpr, DOT_F32: tl.constexpr, TMA: tl.constexpr):
    """One step of the online softmax over SUB tokens of a page: tokens tok >= nvalid are masked
    out. tile / vtile: the [SUB, D] element offsets of K / V (vtile transposed for token-minor FP8
    V pages) from kbase / vbase. TMA: the pages by bulk copies instead (whole pages: SUB = BS)."""
    if TMA:
        D: tl.constexpr = tile.shape[1]
        kt = k_desc.load([(kbase // D).to(tl.int32), 0])
        if FP8:           # token-minor V: a [D, SUB] box, used as [SUB, D]
            vt = tl.trans(v_desc.load([(vbase // SUB).to(tl.int32), 0]))
        else:
            vt = v_desc.load([(vbase // D).to(tl.int32), 0])
    else:
        kt = tl.load(k_ptr + kbase + tile)
        vt = tl.load(v_ptr + vbase + vtile)
    if FP8:               # exact fp8 -> fp16/fp32; the scales act on scores and output
        kt = kt.to(q.dtype)
        vt = vt.to(q.dtype)
    if DOT_F32:
        s = tl.dot(q, tl.trans(kt), input_precision="ieee")
    else:
        s = tl.dot(q, tl.trans(kt))
    if nvalid < SUB:      # only a sequence's last page is partial
        s = tl.where((tok < nvalid)[None, :], s, float("-inf"))
    # base-2 online softmax on unscaled scores: m is max(s)·qk_scale, qk_scale (> 0) carries
    # log2(e), so each score costs one FFMA and one EX2
    m_new = tl.maximum(m, tl.max(s, 1) * qk_scale)
    alpha = tl.exp2(m - m_new)
    p = tl.exp2(s * qk_scale - m_new[:, None])
    l = l * alpha + tl.sum(p, 1)
    if DOT_F32:
        pv = tl.dot(p, vt, input_precision="ieee")
    else:
        pv = tl.dot(p.to(vt.dtype), vt)
    return m_new, l, acc * alpha[:, None] + pv


@triton.jit(do_not_specialize=["dense_len", "num_splits", "s_seln", "s_selh", "s_cntn", "s_cnth"])
def _split_kernel(q_ptr, k_ptr, v_ptr, pt_ptr, slot_ptr, seqlen_ptr, sel_ptr, cnt_ptr,
                  po_ptr, plse_ptr, k_desc, v_desc,
                  s_qn, s_qh, s_kp, s_kh, s_pt, s_seln, s_selh, s_cntn, s_cnth,
                  sm_scale, ks_ptr, vs_ptr, dense_len, num_splits,
                  HKV: tl.constexpr, G: tl.constexpr, BG: tl.constexpr, BS: tl.constexpr,
                  D: tl.constexpr, FP8: tl.constexpr, DOT_F32: tl.constexpr, MAXP: tl.constexpr,
                  SUB: tl.constexpr, EARLY: tl.constexpr, TMA: tl.constexpr, PDL: tl.constexpr = False):
    r = tl.program_id(0)
    sp = tl.program_id(1)
    n = r // HKV
    kh = r % HKV
    # EARLY: slots and seq_lens are never written by the kernel launched just before this one
    # (store_kv or the selection), so they may be read before the wait (pdl.py's exception)
    if not EARLY:
        pdl_wait(PDL)
    slot = tl.load(slot_ptr + n).to(tl.int64)
    seqlen = tl.load(seqlen_ptr + n)
    if EARLY:
        pdl_wait(PDL)
    sparse = seqlen >= dense_len
    cnt = (seqlen + BS - 1) // BS
    if sparse:
        cnt = tl.load(cnt_ptr + n * s_cntn + kh * s_cnth)
    per = (cnt + num_splits - 1) // num_splits
    start = sp * per
    end = tl.minimum(start + per, cnt)
    g = tl.arange(0, BG)
    d = tl.arange(0, D)
    tok = tl.arange(0, SUB)
    NSUB: tl.constexpr = BS // SUB          # steps per page
    gmask = g < G
    q = tl.load(q_ptr + n * s_qn + (kh * G + g)[:, None] * s_qh + d[None, :],
                mask=gmask[:, None], other=0.0)
    if FP8 and not DOT_F32:
        q = q.to(tl.float16)     # fp8 -> fp16 is one packed cvt per 2 values (bf16 needs three)
    qk_scale = sm_scale * 1.4426950408889634           # log2(e): _attend_page works in base 2
    if FP8:
        qk_scale = qk_scale * tl.load(ks_ptr + kh)
    m = tl.full([BG], -1e30, tl.float32)
    l = tl.zeros([BG], tl.float32)
    acc = tl.zeros([BG, D], tl.float32)
    tile = tok[:, None] * D + d[None, :]
    vtile = tile
    vsub = SUB * D                          # element offset of a page's next SUB tokens in V
    if FP8:
        vtile = tok[:, None] + d[None, :] * BS     # token-minor V pages (reference.v_token_minor)
        vsub = SUB
    if MAXP == 0:
        for i in range(start * NSUB, end * NSUB):
            b = i // NSUB
            h = i % NSUB
            if sparse:
                b = tl.load(sel_ptr + n * s_seln + kh * s_selh + b)
            page = tl.load(pt_ptr + slot * s_pt + b).to(tl.int64)
            base = page * s_kp + kh * s_kh
            m, l, acc = _attend_page(q, k_ptr, v_ptr, k_desc, v_desc, base + h * (SUB * D), base + h * vsub, tile,
                                     vtile, tok, seqlen - b * BS - h * SUB, qk_scale, m, l, acc, SUB, FP8, DOT_F32,
                                     TMA)
    else:
        # Page ids (and valid token counts) of up to MAXP pages loaded up front: the K/V addresses
        # of the inner loop then depend on no load of the same iteration, so the pipeliner keeps
        # num_stages - 1 steps in flight (cp.async into multi-buffered shared memory).
        jj = tl.arange(0, MAXP)
        for c0 in range(start, end, MAXP):
            blk = c0 + jj
            live = blk < end
            if sparse:
                blk = tl.load(sel_ptr + n * s_seln + kh * s_selh + blk, mask=live, other=0)
            pg = tl.load(pt_ptr + slot * s_pt + blk, mask=live, other=0).to(tl.int64)
            code = pg * (2 * BS) + tl.minimum(tl.maximum(seqlen - blk * BS, 0), BS)
            for i in range(c0 * NSUB, tl.minimum(c0 + MAXP, end) * NSUB):
                h = i % NSUB
                c = tl.sum(tl.where(jj == i // NSUB - c0, code, 0), 0)      # element i // NSUB - c0, no memory
                base = (c // (2 * BS)) * s_kp + kh * s_kh
                m, l, acc = _attend_page(q, k_ptr, v_ptr, k_desc, v_desc, base + h * (SUB * D), base + h * vsub,
                                         tile, vtile, tok, (c % (2 * BS)).to(tl.int32) - h * SUB, qk_scale, m,
                                         l, acc, SUB, FP8, DOT_F32, TMA)
    ok = l > 0
    if FP8:
        acc = acc * tl.load(vs_ptr + kh)
    o = tl.where(ok[:, None], acc / tl.where(ok, l, 1.0)[:, None], 0.0)
    lse = tl.where(ok, m * 0.6931471805599453 + tl.log(tl.where(ok, l, 1.0)), float("-inf"))   # natural log
    pbase = (r * num_splits + sp).to(tl.int64)
    tl.store(po_ptr + pbase * BG * D + g[:, None] * D + d[None, :], o)
    tl.store(plse_ptr + pbase * BG + g, lse)


@triton.jit(do_not_specialize=["num_splits"])
def _merge_kernel(po_ptr, plse_ptr, o_ptr, num_splits, s_on, s_oh,
                  HKV: tl.constexpr, G: tl.constexpr, BG: tl.constexpr, D: tl.constexpr,
                  DB: tl.constexpr, SP2: tl.constexpr, PDL: tl.constexpr = False):
    """One program per (row, query head, DB-wide slice of D): every split's partial is loaded
    at once (empty splits, lse = -inf, are masked out and cost no memory traffic)."""
    pdl_wait(PDL)
    r = tl.program_id(0)
    g = tl.program_id(1)
    d = tl.program_id(2) * DB + tl.arange(0, DB)
    n = r // HKV
    kh = r % HKV
    sp = tl.arange(0, SP2)
    idx = (r * num_splits + sp).to(tl.int64)
    lse = tl.load(plse_ptr + idx * BG + g, mask=sp < num_splits, other=float("-inf"))
    live = lse > float("-inf")
    m = tl.maximum(tl.max(lse, 0), -1e30)
    w = tl.where(live, tl.exp(lse - m), 0.0)                            # [SP2]
    den = tl.sum(w, 0)
    o = tl.load(po_ptr + (idx * BG + g)[:, None] * D + d[None, :], mask=live[:, None], other=0.0)
    out = tl.sum(o * w[:, None], 0) / tl.where(den > 0, den, 1.0)
    tl.store(o_ptr + n * s_on + (kh * G + g) * s_oh + d, out.to(o_ptr.dtype.element_ty))


def scale_tensor(scale, heads: int, device) -> torch.Tensor:
    """FP8 scales as an fp32 [Hkv] tensor (a float is broadcast)."""
    if isinstance(scale, torch.Tensor):
        return scale.to(device=device, dtype=torch.float32).reshape(-1).expand(heads).contiguous()
    return torch.full((heads,), float(scale), device=device, dtype=torch.float32)


def kernel_scales(pages_dtype, heads: int, device, *scales, unused: torch.Tensor) -> list:
    """The scale pointers a kernel reads for FP8 pages only: fp32 [Hkv] tensors for FP8 pages,
    else `unused` in their place, so a float scale launches no fill kernel (in a CUDA-graph decode
    step each would cost about a microsecond, and the kernels never read them)."""
    if is_fp8(pages_dtype):
        return [scale_tensor(s, heads, device) for s in scales]
    return [unused] * len(scales)


def check_index_strides(page_table, **vectors) -> None:
    """The kernels get only page_table's row stride and no stride of the per-row index vectors
    (slots, seq_lens, ...): both must be unit along what the kernels walk."""
    assert page_table.stride(1) == 1 or page_table.shape[1] == 1, \
        f"page_table needs unit column stride, got strides {page_table.stride()}"
    for name, v in vectors.items():
        assert v.is_contiguous(), f"{name} needs unit stride, got strides {v.stride()}"


def paged_attention(q, k_pages, v_pages, page_table, slots, seq_lens, block_ids=None,
                    num_blocks=None, dense_len: int | None = None, k_scale=1.0, v_scale=1.0,
                    sm_scale: float | None = None, num_splits: int = 8, out=None,
                    config: DecodeConfig | None = None):
    """Same contract as reference.paged_attention. q [n, Hq, D] (unit last stride);
    block_ids [n, Hkv, maxsel] int32 and num_blocks [n, Hkv] int32 (any strides, e.g. 0);
    k_scale/v_scale: float or fp32 [Hkv] (used for FP8 pages only); config: kernel and launch
    knobs (default: DEFAULT_CONFIGS for the page dtype; num_splits is the caller's). With PDL on
    and config.early (the defaults), slots and seq_lens are read before the PDL wait, so they must
    not be written by the kernel launched just before this call (older kernels are fine)."""
    po, plse = split_partials(q, k_pages, v_pages, page_table, slots, seq_lens, block_ids, num_blocks,
                              dense_len, k_scale, v_scale, sm_scale, num_splits, config)
    if out is None:
        out = torch.empty(q.shape, device=q.device, dtype=q.dtype)
    return merge_partials(po, plse, out)


def split_partials(q, k_pages, v_pages, page_table, slots, seq_lens, block_ids=None, num_blocks=None,
                   dense_len: int | None = None, k_scale=1.0, v_scale=1.0, sm_scale: float | None = None,
                   num_splits: int = 8, config: DecodeConfig | None = None):
    """The split kernel alone (paged_attention's arguments): po fp32 [n·Hkv, num_splits, BG, D],
    each split's softmax-normalised output per query head of the group (rows >= G padding), and
    plse fp32 [n·Hkv, num_splits, BG], its natural-log sum of exp(scaled scores) (-inf: empty)."""
    n, hq, d = q.shape
    _, hkv, B, _ = k_pages.shape
    G = hq // hkv
    BG = max(16, triton.next_power_of_2(G))
    assert k_pages.is_contiguous() and v_pages.is_contiguous() and q.stride(-1) == 1
    assert hq % hkv == 0, f"{hq} query heads do not split into groups of the {hkv} KV heads"
    check_index_strides(page_table, slots=slots, seq_lens=seq_lens)
    assert v_pages.shape == k_pages.shape[:2] + ((d, B) if v_token_minor(v_pages.dtype) else (B, d)), \
        "V pages must be [P, Hkv, B, D], or [P, Hkv, D, B] for FP8 (reference.pack_v_pages)"
    sm_scale = sm_scale if sm_scale is not None else 1.0 / math.sqrt(d)
    if block_ids is None or dense_len is None:
        block_ids, num_blocks, dense_len = slots, slots, DENSE_ONLY      # never read
        sel_strides = (0, 0, 0, 0)
    else:
        sel_strides = (block_ids.stride(0), block_ids.stride(1), num_blocks.stride(0), num_blocks.stride(1))
    rows = n * hkv
    po = torch.empty(rows, num_splits, BG, d, device=q.device, dtype=torch.float32)
    plse = torch.empty(rows, num_splits, BG, device=q.device, dtype=torch.float32)
    cfg = config or default_config(k_pages.dtype, rows)
    if B % (cfg.sub or B):      # the kernel takes B // sub steps per page: the rest (all if sub > B) unread
        raise ValueError(f"DecodeConfig.sub {cfg.sub} does not divide the KV pages of {B} tokens; use sub=0 "
                         f"(whole pages) or a power of two >= 16 dividing {B}")
    # the longest row: dense rows have at most page_table.shape[1] blocks (sparse calls: below
    # dense_len), sparse rows at most block_ids.shape[-1]
    max_blocks = page_table.shape[1]
    if dense_len != DENSE_ONLY:
        max_blocks = max(min(max_blocks, math.ceil(dense_len / B)), block_ids.shape[-1])
    tma = cfg.tma and has_tma(q.device)
    k_desc, v_desc = (page_descriptor(k_pages), page_descriptor(v_pages)) if tma else (k_pages, v_pages)
    _split_kernel[(rows, num_splits)](
        q, k_pages, v_pages, page_table, slots, seq_lens, block_ids, num_blocks, po, plse, k_desc, v_desc,
        q.stride(0), q.stride(1), k_pages.stride(0), k_pages.stride(1), page_table.stride(0),
        *sel_strides, float(sm_scale), *kernel_scales(k_pages.dtype, hkv, q.device, k_scale, v_scale, unused=plse),
        int(dense_len), num_splits,
        HKV=hkv, G=G, BG=BG, BS=B, D=d, FP8=is_fp8(k_pages.dtype), DOT_F32=(q.dtype == torch.float32),
        MAXP=cfg.max_pages(max_blocks, num_splits), SUB=cfg.sub or B, EARLY=cfg.early, TMA=tma,
        **cfg.launch(), **launch_args(q.device))
    return po, plse


def has_tma(device: torch.device) -> bool:
    """Hopper or newer (or the interpreter's CPU tensors): other GPUs load pages by cp.async."""
    return device.type != "cuda" or is_sm90(device)


def page_descriptor(pages):
    """TMA descriptor of a page pool [P, Hkv, R, C] as a 2-D [P·Hkv·R, C] row view with one page
    of one KV head per [R, C] box (K and bf16 V: [B, D]; token-minor FP8 V: [D, B])."""
    from triton.tools.tensor_descriptor import TensorDescriptor
    r, c = pages.shape[2], pages.shape[3]
    return TensorDescriptor(pages, [pages.numel() // c, c], [c, 1], [r, c])


def merge_partials(po, plse, out):
    """out [n, Hq, D] from split_partials' (po, plse) by log-sum-exp over the splits."""
    n, hq, d = out.shape
    rows, num_splits, BG, _ = po.shape
    hkv = rows // n
    G = hq // hkv
    DB = min(d, 32)
    _merge_kernel[(rows, G, d // DB)](po, plse, out, num_splits, out.stride(0), out.stride(1),
                                      HKV=hkv, G=G, BG=BG, D=d, DB=DB,
                                      SP2=max(2, triton.next_power_of_2(num_splits)), num_warps=4,
                                      **launch_args(out.device))
    return out


@triton.jit
def _store_kv_kernel(k_ptr, v_ptr, kp_ptr, vp_ptr, pt_ptr, slot_ptr, seqlen_ptr,
                     s_kn, s_kh, s_vn, s_vh, s_p, s_h, s_pt, ks_ptr, vs_ptr,
                     BS: tl.constexpr, D: tl.constexpr, FP8: tl.constexpr, FP8_MAX: tl.constexpr,
                     PDL: tl.constexpr = False):
    pdl_wait(PDL)
    r = tl.program_id(0)
    h = tl.program_id(1)
    slot = tl.load(slot_ptr + r).to(tl.int64)
    t = tl.load(seqlen_ptr + r) - 1
    page = tl.load(pt_ptr + slot * s_pt + t // BS).to(tl.int64)
    d = tl.arange(0, D)
    k = tl.load(k_ptr + r * s_kn + h * s_kh + d)
    v = tl.load(v_ptr + r * s_vn + h * s_vh + d)
    if FP8:
        k = k.to(tl.float32) / tl.load(ks_ptr + h)
        v = v.to(tl.float32) / tl.load(vs_ptr + h)
        k = tl.minimum(tl.maximum(k, -FP8_MAX), FP8_MAX)
        v = tl.minimum(tl.maximum(v, -FP8_MAX), FP8_MAX)
    dst = page * s_p + h * s_h + (t % BS) * D + d
    tl.store(kp_ptr + dst, k.to(kp_ptr.dtype.element_ty))
    if FP8:
        dst = page * s_p + h * s_h + d * BS + t % BS      # token-minor V pages
    tl.store(vp_ptr + dst, v.to(vp_ptr.dtype.element_ty))


def store_kv(k_pages, v_pages, k, v, page_table, slots, seq_lens, k_scale=1.0, v_scale=1.0) -> None:
    """Write row r's k, v [n, Hkv, D] (any row/head strides, unit last stride) at position
    seq_lens[r]-1 of the sequence in slots[r] (FP8 pages: saturate(x / scale), kv_fp8's policy;
    FP8 V pages are token-minor)."""
    n, hkv, d = k.shape
    if n == 0:
        return
    assert k_pages.is_contiguous() and v_pages.is_contiguous() and k.stride(-1) == 1 and v.stride(-1) == 1
    check_index_strides(page_table, slots=slots, seq_lens=seq_lens)
    fp8 = is_fp8(k_pages.dtype)
    _store_kv_kernel[(n, hkv)](k, v, k_pages, v_pages, page_table, slots, seq_lens,
                               k.stride(0), k.stride(1), v.stride(0), v.stride(1),
                               k_pages.stride(0), k_pages.stride(1), page_table.stride(0),
                               *kernel_scales(k_pages.dtype, hkv, k.device, k_scale, v_scale, unused=seq_lens),
                               BS=k_pages.shape[2], D=d, FP8=fp8,
                               FP8_MAX=float(torch.finfo(k_pages.dtype).max) if fp8 else 0.0,
                               num_warps=1, **launch_args(k.device))

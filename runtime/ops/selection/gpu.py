"""InfLLM-V2 selection on the GPU over paged caches: launchers for the Triton kernels in
triton.py (compression; prefill selection, several queries of one sequence per tile, + torch.topk)
and triton_decode.py + triton_rank.py / triton_radix.py (decode selection: three to five
launches, work proportional to each row's length, top-k in the kernel). Static shapes throughout
(graph-safe); exactly DESIGN.md §2, checked against reference.select_blocks on random inputs."""

from __future__ import annotations

import math
import struct

import torch
import triton

from salactl.runtime.config import SparseConfig
from salactl.runtime.ops.decode_attention.reference import is_fp8
from salactl.runtime.ops.decode_attention.triton import kernel_scales
from salactl.runtime.ops.device_props import sm_count
from salactl.runtime.ops.pdl import launch_args
from salactl.runtime.ops.selection import triton as kern
from salactl.runtime.ops.selection import triton_decode as dkern
from salactl.runtime.ops.selection import triton_rank as rkern

_NEG_INF_BITS = struct.unpack("<i", struct.pack("<f", float("-inf")))[0]
# Largest key whose score is -inf (not a candidate): everything above it is selectable.
NEG_INF_KEY_MAX = (_NEG_INF_BITS ^ 0x7FFFFFFF) * 2 ** 32 + (2 ** 32 - 1)


def check_shapes(sc: SparseConfig) -> None:
    for name, v in (("kernel_size", sc.kernel_size), ("block_size", sc.block_size)):
        if v & (v - 1):
            raise ValueError(f"the GPU selection needs a power-of-two sparse_config.{name}, got {v}")


def compress_update(k_pages, k1_pages, page_table, slots, starts, counts, max_count: int,
                    sc: SparseConfig, k_scale=1.0) -> None:
    """For each entry e: K1_j for j in [starts[e], starts[e]+counts[e]) of the sequence in
    slots[e] (counts[e] <= max_count). k_pages [P, Hkv, B, D]; k1_pages [P, Hkv, B/st, D]."""
    if max_count <= 0 or slots.numel() == 0:
        return
    P, hkv, B, D = k_pages.shape
    fp8 = is_fp8(k_pages.dtype)
    kern._compress_kernel[(max_count, slots.numel(), hkv)](
        k_pages, k1_pages, page_table, slots, starts, counts,
        k_pages.stride(0), k_pages.stride(1), k1_pages.stride(0), k1_pages.stride(1),
        page_table.stride(0), *kernel_scales(k_pages.dtype, hkv, k_pages.device, k_scale, unused=counts),
        BS=B, ST=sc.kernel_stride, KS=sc.kernel_size, D=D, FP8=fp8, num_warps=4, **launch_args(k_pages.device))


def select_paged(q, k1_pages, page_table, slots, seq_lens, sc: SparseConfig, nb_max: int,
                 one_sequence: bool = False, num_splits: int | None = None, **decode_kw):
    """Selected blocks for each query row. q [n, Hq, D]; slots/seq_lens [n] int32 (a query at
    position t has seq_len t+1). With one_sequence=True all rows belong to one sequence and are
    processed several queries per tile (prefill); otherwise `select_decode` (decode_kw go there).
    Returns (block_ids [n, Hkv, K] int32 in descending score order, entries past the count
    unspecified; counts [n, Hkv] int32), K = min(topk + window/block, nb_max)."""
    if not one_sequence:
        return select_decode(q, k1_pages, page_table, slots, seq_lens, sc, nb_max,
                             lse_splits=num_splits, **decode_kw)
    n, hq, D = q.shape
    _, hkv, wpp, _ = k1_pages.shape
    G = hq // hkv
    gp = triton.next_power_of_2(G)
    qg = max(1, 64 // gp) if one_sequence else 1
    BG = max(gp, 16 // qg)
    groups = triton.cdiv(n, qg)
    rows = groups * hkv
    if num_splits is None:
        num_splits = max(1, min(64, math.ceil(264 / rows)))
    sm_scale = 1.0 / math.sqrt(D)
    dot_f32 = q.dtype == torch.float32
    plse = torch.empty(rows * num_splits * qg * BG, device=q.device, dtype=torch.float32)
    common = dict(HKV=hkv, G=G, BG=BG, QG=qg, D=D, WPP=wpp, KS=sc.kernel_size,
                  ST=sc.kernel_stride, DOT_F32=dot_f32, num_warps=4)
    kern._score_lse_kernel[(rows, num_splits)](
        q, k1_pages, page_table, slots, seq_lens, plse, n, q.stride(0), q.stride(1),
        k1_pages.stride(0), k1_pages.stride(1), page_table.stride(0), sm_scale, num_splits,
        BW=64, **common)
    keys = torch.empty(n, hkv, nb_max, device=q.device, dtype=torch.int64)
    NB = 32
    kern._block_score_kernel[(rows, triton.cdiv(nb_max, NB))](
        q, k1_pages, page_table, slots, seq_lens, plse, keys, n, nb_max, q.stride(0), q.stride(1),
        k1_pages.stride(0), k1_pages.stride(1), page_table.stride(0), keys.stride(0), keys.stride(1),
        sm_scale, num_splits, LEFT=sc.kernel_size // sc.kernel_stride - 1, BS=sc.block_size, NB=NB,
        INIT=sc.init_blocks, WINB=sc.window_blocks, SP2=max(2, triton.next_power_of_2(num_splits)), **common)
    k = min(sc.selected_blocks, nb_max)
    vals, idx = torch.topk(keys, k, dim=-1)
    counts = (vals > NEG_INF_KEY_MAX).sum(-1, dtype=torch.int32)
    return idx.to(torch.int32), counts


# Launch defaults of select_decode (edit from benchmarks/sparse_decode_bench.py's sweep).
# Pass 2 (`nbc` blocks per program, `num_warps`; `p2_early`: its K1 scores before the PDL wait) stores int32 score words and the
# row's top-12-bit histogram;
# the top-k (triton_rank.topk_launch) then ranks them: rows longer than `short_blocks` blocks are
# first gathered down to the histogram's threshold bin (`gather_chunk` blocks per program), then
# ranked (`rank_rb` keys per program and step against `rank_ct`-wide tiles, `rank_warps`); shorter
# rows are ranked the same way when the batch has at most `rank_short_rows` rows, else take the
# one-program radix select (triton_radix.py, `radix_warps`).
# lse_splits: pass-1 programs per row (None: about four per SM, at most 256, plus the compress
# split of the fused K1 update where that keeps pass 2's merge tile; given: the compress split
# included, so at least 2).
# Why these values (H200; the runs, commands and commits: BENCHMARKS.md, GPU engine sessions 3-35):
# - the rank top-k (rb32 ct256 w8) beat the grid threshold select at 1M and at 128K up to 4 short
#   rows; larger batches of short rows keep the one-program radix select.
# - dedup: one histogram atomic per distinct bin of a program, since a row's blocks crowd into a
#   few of the 4096 bins and per-block atomics serialise on them.
# - pass 2: 32 blocks per program on 4 warps, p2_early (its K1 scores before the PDL wait, so its
#   programs overlap the lse pass).
# - the lse pass: 128 windows per step, 2 stages, one online softmax per (head, window slot).
# - short_blocks 4096: 128K rows gathered before their rank were slower.
# Designs measured slower and not kept: BENCHMARKS.md, "Tuning notes moved from code comments".
DECODE_DEFAULTS = dict(nbc=32, num_warps=4, lse_splits=None, dedup=True,
                       p2_early=True, lse_bw=128, lse_elem=True, lse_warps=4, lse_stages=2, short_blocks=4096, gather_chunk=1024,
                       rank_rb=32, rank_ct=256, rank_warps=8, rank_short_rows=4, radix_warps=8)


def group_rows(G: int) -> int:
    """Rows of the decode kernels' M tile for a group of G query heads (tl.dot needs >= 16)."""
    return max(16, triton.next_power_of_2(G))


def lse_constexprs(sc: SparseConfig, hq: int, hkv: int, D: int, bw: int, dot_f32: bool, fuse: bool,
                   fp8: bool, elem: bool) -> dict:
    """The compile-time arguments `_lse_kernel` (pass 1) is launched with (also what
    tools/sass_loops.py compiles offline)."""
    G = hq // hkv
    return dict(HKV=hkv, G=G, BG=group_rows(G), D=D, WPP=sc.block_size // sc.kernel_stride, KS=sc.kernel_size,
                ST=sc.kernel_stride, BS=sc.block_size, BW=bw, ELEM=elem, NCTR=rkern.NCTR,
                NCTR2=triton.next_power_of_2(rkern.NCTR), FUSE_K1=fuse, FP8=fp8, DOT_F32=dot_f32)


def words_constexprs(sc: SparseConfig, hq: int, hkv: int, D: int, nbc: int, lse_splits: int,
                     dot_f32: bool, dedup: bool, early: bool = False, fuse: bool = False) -> dict:
    """The compile-time arguments `_block_words_kernel` (pass 2) is launched with (also what
    tools/sass_loops.py compiles offline)."""
    G = hq // hkv
    return dict(HKV=hkv, G=G, BG=group_rows(G), D=D, WPP=sc.block_size // sc.kernel_stride,
                LEFT=sc.kernel_size // sc.kernel_stride - 1, KS=sc.kernel_size, ST=sc.kernel_stride,
                BS=sc.block_size, NBC=nbc, NCTR=rkern.NCTR, INIT=sc.init_blocks, WINB=sc.window_blocks,
                SP2=max(2, triton.next_power_of_2(lse_splits)), DOT_F32=dot_f32, DEDUP=dedup,
                EARLY=early, FUSE_K1=fuse)


def select_decode(q, k1_pages, page_table, slots, seq_lens, sc: SparseConfig, nb_max: int,
                  k_pages=None, k1_start=None, k1_count=None, k_scale=1.0,
                  lse_splits: int | None = None, nbc: int | None = None, num_warps: int | None = None,
                  **knobs):
    """One query per row (decode): triton_decode.py's lse and score-word passes, then
    triton_rank.topk_launch's top-k (one to three launches, fixed by the batch and table width).
    With k_pages, k1_start and k1_count given, the window completed by each row's token
    (k1_count 0/1) is compressed into k1_pages by the first launch (replaces compress_update);
    k1_start must be the row's last visible window, (seq_len - kernel_size) // kernel_stride, as
    GPUBatch.build gives it (the window a decode token completes).
    nb_max: the static block width (launch grid); each row's work follows its own seq_len.
    knobs: the other DECODE_DEFAULTS entries (dedup, p2_early, lse_bw, lse_elem, lse_warps,
    lse_stages, short_blocks, gather_chunk, rank_rb, rank_ct, rank_warps, rank_short_rows,
    radix_warps); knobs left out or None take DECODE_DEFAULTS. Same result as select_paged."""
    dflt = DECODE_DEFAULTS
    n, hq, D = q.shape
    hkv = k1_pages.shape[1]
    BG = group_rows(hq // hkv)
    rows = n * hkv
    dev = q.device

    unknown = set(knobs) - set(dflt)
    if unknown:
        raise TypeError(f"select_decode: unknown knobs {sorted(unknown)}; valid: {sorted(dflt)}")

    def knob(value, name):
        return dflt[name] if value is None else value

    k = {name: knob(knobs.get(name), name) for name in dflt}
    fuse = k_pages is not None and k1_start is not None and k1_count is not None
    lse_splits = knob(lse_splits, "lse_splits")
    if lse_splits is None:                # about four programs per SM
        lse_splits = max(1, min(256, math.ceil(4 * sm_count(dev) / rows)))
        # with the K1 update the last split only compresses (triton_decode.py): one more split,
        # unless that would double pass 2's merge tile (SP2, a power of 2)
        if fuse and triton.next_power_of_2(lse_splits + 1) == triton.next_power_of_2(lse_splits):
            lse_splits += 1
    if fuse:
        lse_splits = max(2, lse_splits)
    nbc = knob(nbc, "nbc")                # blocks per program of pass 2
    num_warps = knob(num_warps, "num_warps")  # pass 2's warps
    dedup, lse_bw, lse_warps, lse_stages = k["dedup"], k["lse_bw"], k["lse_warps"], k["lse_stages"]
    K = min(sc.selected_blocks, nb_max)
    assert all(v > 0 and v & (v - 1) == 0 for v in (lse_bw, nbc)), "powers of 2 expected"
    nctr = rkern.NCTR                     # the gather count and the top-12-bit histogram
    sm_scale = 1.0 / math.sqrt(D)
    dot_f32 = q.dtype == torch.float32
    fp8 = fuse and is_fp8(k_pages.dtype)
    plse = torch.empty(rows * lse_splits * BG, device=dev, dtype=torch.float32)
    ctr = torch.empty(rows * nctr, device=dev, dtype=torch.int32)
    words = torch.empty(rows, nb_max, device=dev, dtype=torch.int32)
    sel = torch.empty(n, hkv, K, device=dev, dtype=torch.int32)
    cnt = torch.empty(n, hkv, device=dev, dtype=torch.int32)
    kp = k_pages if fuse else k1_pages
    js, jc = (k1_start, k1_count) if fuse else (slots, slots)
    dkern._lse_kernel[(rows, lse_splits)](
        q, k1_pages, page_table, slots, seq_lens, plse, ctr, kp, js, jc,
        *kernel_scales(kp.dtype, hkv, dev, k_scale, unused=plse),
        q.stride(0), q.stride(1), k1_pages.stride(0), k1_pages.stride(1), kp.stride(0), kp.stride(1),
        page_table.stride(0), sm_scale, lse_splits,
        **lse_constexprs(sc, hq, hkv, D, lse_bw, dot_f32, fuse, fp8, k["lse_elem"]),
        num_warps=lse_warps, num_stages=lse_stages, **launch_args(dev))
    dkern._block_words_kernel[(rows, triton.cdiv(nb_max, nbc))](
        q, k1_pages, page_table, slots, seq_lens, plse, words, ctr, js, jc,
        q.stride(0), q.stride(1), k1_pages.stride(0), k1_pages.stride(1), page_table.stride(0),
        words.stride(0), sm_scale, lse_splits,
        **words_constexprs(sc, hq, hkv, D, nbc, lse_splits, dot_f32, dedup, k["p2_early"], fuse),
        num_warps=num_warps, **launch_args(dev))
    rkern.topk_launch(seq_lens, words, ctr, sel, cnt, hkv, sc.block_size, K,
                      small=min(k["short_blocks"], triton.next_power_of_2(nb_max)), chunk=k["gather_chunk"],
                      rb=k["rank_rb"], ct=k["rank_ct"], rank_warps=k["rank_warps"],
                      short_rows=k["rank_short_rows"], radix_warps=k["radix_warps"])
    return sel, cnt

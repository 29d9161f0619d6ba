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
# Session 16 (H200, `sparse_decode_bench.py --quick --breakdown --variants rank --batch
# 1,2,4,8,32`), selection with the fused K1 in us, the grid threshold select before -> ranks
# (rb32 ct256 w8): 1M + 100 batch 1 40.5 -> 33.9, batch 2 66.3 -> 59.0, batch 4 115.1 -> 102.6,
# batch 8 199.5 -> 189.8, batch 32 676.9 -> 687.2 (rb16 w4: 675.8); 128K + 100 batch 1 29.6 ->
# 19.3, batch 2 29.9 -> 25.1, batch 4 35.5 -> 36.9 (rb8 w4: 30.3), batch 8 47.1 -> 68.9 (rb16 w4:
# 52.0), batch 32 140.3 -> 273.4 (rb16 w4: 206.3): short rows ranked up to 4 rows (batch 2).
# H200 history: sessions 3-4 measured a radix top-k (per 2048-block group + merge) and "hist"
# (the row's last pass-2 program selecting over the whole row); session 5's threshold select
# beat both (1M + 100: 59.1 vs hist 69.6 us per layer; 128K + 100: 38.5 vs 41.1; engine 9B step
# at 1M: pass 2 + thresh 37 us per layer vs hist ~62), so radix and hist were removed. With the
# second-level histogram (9281cda): 55.6 / 35.4 us; 256 lse splits instead of 128 at batch 1
# (the cap was 128): lse pass 18.3 -> 14.2 us at 1M, selection 53.0 us; 128K unchanged (35.3).
# Session 8: rows of at most `short_blocks` blocks (128K context: 2049) take the top-k in one
# program of `radix_warps` warps, radix select in registers (triton_radix.py).
# Tried and reverted in session 8 (H200, 45e94ab): pass 1 storing its scores for pass 2 (K1
# read once): at 1M pass 1 14.2 -> 18.3 us, pass 2 only 20.8 -> 18.0 (so pass 2 is not bound by
# its K1 reads), selection 53.3 -> 55.7 us; and ranking the picks by one [KP, KP] comparison
# instead of tl.sort: the top-k 1-3 us slower. At d277004, pass 2's histogram as a local 4096-bin
# tl.histogram then one atomic per distinct bin: pass 2 21 -> 86 us at 1M (tl.histogram's cost
# grows with the bin count).
# Session 11 (H200 at aa0a557, sparse_decode_bench.py --quick --breakdown --variants dedup): pass 2
# adding one histogram atomic per distinct bin of its program (dedup) instead of one per block:
# pass 2 21.0 -> 16.7 us at 1M + 100 (random keys put its 16,384 blocks in 4 of the 4096 bins, so
# the per-block atomics serialised on 4 addresses), selection 51.2 -> 48.0; 128K unchanged (6.6 us).
# Same session, `--variants "lse bw128,lse bw256,lse st2,p2 "` at 0acba0e (us per kernel, 1M + 100 /
# 128K + 100): the lse pass with 128 windows per step, 11.0 / 5.1 against 14.3 / 5.2 (bw256 w8
# 13.0 / 6.1, 64 with 2 stages 14.0 / 4.6); pass 2 with 32 blocks per program on 4 warps, 16.5 /
# 6.1 against 16.9 / 6.5 (64 on 4 warps 17.9 / 6.9, 128 on 8 warps 20.2 / 9.5); the top-k keeps 8.
# Then (add0847, `--variants "p2 "`): pass 2 on 2 warps, 13.3 against 16.3 us at 1M but 7.1 against
# 6.1 at 128K (both in the 1M-wide table): 2 warps for tables wider than short_blocks blocks (256K
# tokens, where rows that long exist), 4 otherwise (since 6881a66: 4 everywhere); 16 blocks per
# program lost (20.1 / 26.8 at 1M).
# Session 12 (H200, all reverted; BENCHMARKS.md): pass 2 with its raw window scores first (two dots)
# and the lse merge after them, slots / seq_lens / q / page-table entries read before the PDL
# wait, the lse pass prefetching its K1 rows into L2 before the wait (lse 10.9 -> 12.5 us at 1M),
# the grid top-k launched before the one-program kernel's wait (selection +5 us at 1M), pass 2's
# registers capped at 128 for one wave at 1M (13.1-13.2 against 13.2-13.3 us): none faster.
# With the knobs off, only reordering pass 2's index math and q load (ahead of the lse merge) took
# it from 146 to 154 registers and from 13.4 to 18.2 us at 1M (`python tools/sass_loops.py
# select-words` gives the registers). Pass 1 storing its scaled scores for pass 2 to read as
# contiguous tiles (d2424d1; session 8 read them strided): pass 2 10.7 us without any K1 read,
# but pass 1 +4 us, selection 46.6-51.9 against 40.9-43.3 us.
# Session 13 (H200, 3a7d11d / 70f3126, reverted): both passes as one launch, every program resident,
# the lse split then a barrier per row (atomic count + flag, self-resetting under graph replay)
# then the words of its share of the row's blocks. Exact (every GPU check and a CUDA-graph replay
# test passed), but at 1M the selection took 48.6-71.6 us against 39.9-40.6 (128K: 28.6-42.2
# against 29.1-30.7): 146 registers and 46 KB of shared memory hold 128 programs per row resident,
# not 256, and each then walks its 2-4 chunks of blocks one after another, where pass 2's 1,024
# short programs overlap their latency chains.
# Session 14 (H200, 4187728, reverted): pass 2 storing each program's largest sort key and the
# top-k's chunk programs keeping only keys >= the K-th largest of those (tl.sort of the row's 1,024
# maxima in every chunk program), the last program sorting up to 256 kept keys at once: at 1M + 100
# the selection took 53.4 us against 45.3 without the bound in the same build and 41.8 before it
# (the 1,024-key sort alone +6 us in the top-k; pass 2 +3-5 us for its maximum).
# Same session (c5dda73, reverted): pass 2 with about 1,056 programs, each looping over its row's
# chunks (no empty programs when a wide table meets a large batch), the loop not software-pipelined
# (pipelined it took 46 KB of shared memory): selection 50.7 against 39.0 us at 1M + 100 batch 1
# even with one chunk per program (52.7), 143.9 against 139.2 at 128K + 100 batch 32 (130.5 with
# 2,112 programs, but 803 against 673 at 1M batch 32).
# Session 20 (H200, uncommitted knobs, BENCHMARKS.md): keeping more of K1 in L2 for pass 2's re-read
# (its chunks last to first, evict_first / evict_last K1 loads in either pass, the lse splits
# reversed): the cold selection at 1M + 100 within 1.5% of the default, pass 2 reversed 4-5 us
# slower; the lse merged once per row by the lse pass's last split (a ticket): lse pass +2.4 us,
# pass 2 +1.5 us at 1M (5.1 against 6.9 at 128K), selection 35.3 against 33.1 us. Pass 2's
# histogram atomics cost it 0.6 us at 1M.
# Session 21 (H200, `sparse_decode_bench.py --quick --cold --batch 1,2,4 --variants early`): pass 2
# computing its K1 scores before its PDL wait (p2_early; its programs start while the lse pass runs
# and only merge the lse, pool and store after it), selection warm / cold us, late w2 (the wide
# default before) -> early w4: 1M + 100 batch 1 32.9 / 37.2 -> 31.3 / 35.1, batch 2 58.7 / 60.3 ->
# 53.8 / 56.2, batch 4 101.0 -> 100.8; 128K + 100 batch 1 18.5 / 21.3 -> 15.0 / 16.9, batch 2
# 23.1 -> 20.1, batch 4 30.7 -> 28.5; in a 2052-block table 128K + 100 batch 1 20.1 -> 16.6 (late w4,
# that table's default before). Early on 2 warps 32.3 / 16.2 (1M / 128K batch 1), lse splits
# 128 / 192 or 2 stages, 16 or 64 blocks per program, 8 warps: none better everywhere. Reverted:
# the lse pass triggering at once and running its dots before its own wait (store_kv before it
# writes neither q nor K1): 1M b1 31.7 against 32.6, 128K 15.2 against 15.0 (noise); register caps
# for more early pass-2 programs beside the lse pass (pass 2 at 80 / 64, the lse pass at 80 / 64):
# 31.9-32.9 against 32.1 at 1M b1, 15.1-16.1 against 15.1 at 128K.
# Session 22 (H200, reverted): long rows gathered inside the rank launch (each rank program of the
# row compacting all its words, no gather launch, no atomics): exact, but the rank launch took
# 14.9-24 us at 1M + 100 batch 1 against gather 3.7 + rank 3.1; selection 44.6-47.8 against 31.2.
# Same session (870b4bf, reverted): the lse and words passes as one launch, the scores kept in
# registers across a barrier per row (whole grid resident, registers capped at 128; K1 read once):
# 24-29 us against lse 10.5 + pass 2 15.9 at 1M batch 1, selection 33.1-38.0 / 39.5-41.9 cold
# against 32.6 / 35.4; 128K 19.9-23.1 against 15.5.
# Session 30 (H200, after the lse pass's base-2 softmax): lse_stages 2 instead of 3, three alternating
# pairs of `sparse_decode_bench.py --quick --cold --skip-checks --variants none --defaults lse_stages=2`,
# sparse total warm / cold us: 1M + 100 b1 40.0-41.3 / 43.2-43.7 against 41.0-41.3 / 43.6-44.0,
# 128K + 100 b1 22.9-23.0 / 24.7-25.1 against 23.0-23.2 / 24.9-25.2, 1M b2 64.3-64.7 / 65.8-66.4
# against 64.9-65.9 / 66.3-67.4, 128K b2 30.9-31.0 / 33.6-33.7 against 31.3 / 34.5-34.7.
# Same session: lse_elem, one online softmax per (head, window slot) merged once at the end instead
# of a row max and sum across the warps at every step (the loop's barriers 8 -> 2, no shuffles, 96
# registers against 67). Two alternating pairs (`--batch 1`, `--defaults lse_elem=1`), sparse total
# warm / cold us: 1M + 100 b1 39.4-39.5 / 42.4-42.7 against 40.1-41.5 / 43.1-43.2, 128K + 100 b1
# 23.0-23.1 / 24.5-24.6 against 22.8-23.2 / 25.0-25.6; at batch 2 (one pair and a half) 1M 63.1-63.5
# / 65.5-65.9 against 64.3 / 66.3, but 128K cold 35.8 against 34.1 (warm 31.0 against 31.2).
# Session 35 (H200, `--defaults short_blocks=1024`): 128K rows gathered before their rank, selection
# 20.5-21.4 against 14.1 us at 128K + 100 batch 1 (sparse total 26.5-27.4 against 23.2): kept 4096.
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

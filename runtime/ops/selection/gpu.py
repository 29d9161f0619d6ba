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

from salactl.errors import ConfigError
from salactl.runtime.config import LIGHTNING, SPARSE, SalaConfig, SparseConfig
from salactl.runtime.ops.decode_attention.reference import is_fp8
from salactl.runtime.ops.decode_attention.triton import check_index_strides, kernel_scales
from salactl.runtime.ops.device_props import sm_count
from salactl.runtime.ops.pdl import launch_args
from salactl.runtime.ops.selection import triton as kern
from salactl.runtime.ops.selection import triton_decode as dkern
from salactl.runtime.ops.selection import triton_rank as rkern
from salactl.runtime.ops.selection.tuning import SelectionTuning

_NEG_INF_BITS = struct.unpack("<i", struct.pack("<f", float("-inf")))[0]
# Largest key whose score is -inf (not a candidate): everything above it is selectable.
NEG_INF_KEY_MAX = (_NEG_INF_BITS ^ 0x7FFFFFFF) * 2 ** 32 + (2 ** 32 - 1)


_USE_REFERENCE = ("run it on the reference engine (profile --backend reference, bench --engine reference; "
                  "salactl run falls back to it)")


def unsupported_shape(config: SalaConfig) -> str | None:
    """Why the GPU engine's Triton kernels cannot run the model, or None: they take power-of-two sparse
    kernel and block sizes, blocks (the KV pages) of at least 16 tokens and power-of-two head
    dimensions of at least 16 (16 is tl.dot's smallest K on NVIDIA for 16-bit and FP8 operands; the
    decode attention's P @ V contracts over a page's tokens; Triton's CPU interpreter has no minimum)."""
    sc = config.sparse_config
    for name, v in (("kernel_size", sc.kernel_size), ("block_size", sc.block_size)):
        if v & (v - 1):
            return f"the GPU selection needs a power-of-two sparse_config.{name}, got {v}"
    if sc.block_size < 16:
        return f"the GPU engine's KV pages are sparse blocks, which its attention needs >= 16 tokens, got {sc.block_size}"
    dims = (("head_dim", config.head_dim, SPARSE), ("lightning_head_dim", config.lightning_head_dim, LIGHTNING))
    for name, v, mixer in dims:
        if mixer in config.mixer_types and (v < 16 or v & (v - 1)):
            return f"the GPU engine's kernels need a power-of-two {name} >= 16, got {v}"
    return None


def check_shapes(config: SalaConfig) -> None:
    """A ConfigError where unsupported_shape finds one."""
    problem = unsupported_shape(config)
    if problem:
        raise ConfigError(f"{problem}; {_USE_REFERENCE}")


def compress_update(k_pages, k1_pages, page_table, slots, starts, counts, max_count: int,
                    sc: SparseConfig, k_scale=1.0) -> None:
    """For each entry e: K1_j for j in [starts[e], starts[e]+counts[e]) of the sequence in
    slots[e] (counts[e] <= max_count). k_pages [P, Hkv, B, D]; k1_pages [P, Hkv, B/st, D]."""
    if max_count <= 0 or slots.numel() == 0:
        return
    check_index_strides(page_table, slots=slots, starts=starts, counts=counts)
    P, hkv, B, D = k_pages.shape
    fp8 = is_fp8(k_pages.dtype)
    kern._compress_kernel[(max_count, slots.numel(), hkv)](
        k_pages, k1_pages, page_table, slots, starts, counts,
        k_pages.stride(0), k_pages.stride(1), k1_pages.stride(0), k1_pages.stride(1),
        page_table.stride(0), *kernel_scales(k_pages.dtype, hkv, k_pages.device, k_scale, unused=counts),
        BS=B, ST=sc.kernel_stride, KS=sc.kernel_size, D=D, FP8=fp8, num_warps=4, **launch_args(k_pages.device))


def select_paged(q, k1_pages, page_table, slots, seq_lens, sc: SparseConfig, nb_max: int,
                 one_sequence: bool = False, num_splits: int | None = None):
    """Selected blocks for each query row. q [n, Hq, D]; slots/seq_lens [n] int32 (a query at
    position t has seq_len t+1). With one_sequence=True all rows belong to one sequence and are
    processed several queries per tile (prefill); otherwise `select_decode` (num_splits, if
    given, as its lse_splits). Returns (block_ids [n, Hkv, K] int32 in descending score order,
    entries past the count unspecified; counts [n, Hkv] int32),
    K = min(topk + window/block, nb_max)."""
    if not one_sequence:
        tuning = None if num_splits is None else DECODE_TUNING.with_knobs(lse_splits=num_splits)
        return select_decode(q, k1_pages, page_table, slots, seq_lens, sc, nb_max, tuning=tuning)
    check_index_strides(page_table, slots=slots, seq_lens=seq_lens)
    n, hq, D = q.shape
    _, hkv, wpp, _ = k1_pages.shape
    G = hq // hkv
    gp = triton.next_power_of_2(G)
    qg = max(1, 64 // gp)
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


# select_decode's knobs where none are given (benchmarks rebind it for a run).
DECODE_TUNING = SelectionTuning()


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


def default_lse_splits(rows: int, sms: int, fuse: bool) -> int:
    """select_decode's lse-pass splits per row where the tuning gives none: about four programs per SM."""
    splits = max(1, min(256, math.ceil(4 * sms / rows)))
    # with the K1 update the last split only compresses (triton_decode.py): one more split,
    # unless that would double pass 2's merge tile (SP2, a power of 2)
    if fuse and triton.next_power_of_2(splits + 1) == triton.next_power_of_2(splits):
        splits += 1
    return splits


def select_decode(q, k1_pages, page_table, slots, seq_lens, sc: SparseConfig, nb_max: int,
                  k_pages=None, k1_start=None, k1_count=None, k_scale=1.0,
                  tuning: SelectionTuning | None = None):
    """One query per row (decode): triton_decode.py's lse and score-word passes, then
    triton_rank.topk_launch's top-k (one to three launches, fixed by the batch and table width).
    With k_pages, k1_start and k1_count given, the window completed by each row's token
    (k1_count 0/1) is compressed into k1_pages by the first launch (replaces compress_update);
    k1_start must be the row's last visible window, (seq_len - kernel_size) // kernel_stride, as
    GPUBatch.build gives it (the window a decode token completes).
    nb_max: the static block width (launch grid); each row's work follows its own seq_len.
    tuning: the launch knobs (None: DECODE_TUNING). Same result as select_paged."""
    tuning = DECODE_TUNING if tuning is None else tuning
    n, hq, D = q.shape
    hkv = k1_pages.shape[1]
    BG = group_rows(hq // hkv)
    rows = n * hkv
    dev = q.device

    fuse = k_pages is not None and k1_start is not None and k1_count is not None
    check_index_strides(page_table, slots=slots, seq_lens=seq_lens)
    if fuse:
        check_index_strides(page_table, k1_start=k1_start, k1_count=k1_count)
    # the kernels mask a row's blocks by its seq_len, which the host does not read: only a width that
    # covers every page of the table keeps the score words in their [rows, nb_max] buffer
    assert nb_max >= page_table.shape[1], \
        f"nb_max {nb_max} is narrower than the page table's {page_table.shape[1]} pages per row; pass page_table.shape[1]"
    lse_splits = tuning.lse_splits
    if lse_splits is None:
        lse_splits = default_lse_splits(rows, sm_count(dev), fuse)
    if fuse:
        lse_splits = max(2, lse_splits)
    K = min(sc.selected_blocks, nb_max)
    assert all(v > 0 and v & (v - 1) == 0 for v in (tuning.lse_bw, tuning.nbc)), \
        "powers of 2 expected"
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
        **lse_constexprs(sc, hq, hkv, D, tuning.lse_bw, dot_f32, fuse, fp8, tuning.lse_elem),
        num_warps=tuning.lse_warps, num_stages=tuning.lse_stages, **launch_args(dev))
    dkern._block_words_kernel[(rows, triton.cdiv(nb_max, tuning.nbc))](
        q, k1_pages, page_table, slots, seq_lens, plse, words, ctr, js, jc,
        q.stride(0), q.stride(1), k1_pages.stride(0), k1_pages.stride(1), page_table.stride(0),
        words.stride(0), sm_scale, lse_splits,
        **words_constexprs(sc, hq, hkv, D, tuning.nbc, lse_splits, dot_f32, tuning.dedup,
                           tuning.p2_early, fuse),
        num_warps=tuning.num_warps, **launch_args(dev))
    rkern.topk_launch(seq_lens, words, ctr, sel, cnt, hkv, sc.block_size, K,
                      small=min(tuning.short_blocks, triton.next_power_of_2(nb_max)),
                      chunk=tuning.gather_chunk,
                      rb=tuning.rank_rb, ct=tuning.rank_ct, rank_warps=tuning.rank_warps,
                      short_rows=tuning.rank_short_rows, radix_warps=tuning.radix_warps)
    return sel, cnt

"""One sparse layer's decode attention on one GPU: InfLLM-V2 (K1 update + selection +
paged attention over the selected blocks) vs dense paged attention, sala-9b shapes, bf16,
batch 1 (and more rows of the same context with --batch).

    python benchmarks/sparse_decode_bench.py [--quick] [--variants rank,gather] [--breakdown] [--batch 1,4]
        [--attn-splits 96,32,16] [--layout sequential] [--cold] [--defaults k=v,..] [--attn-defaults k=v,..]
        [--out DIR]

1. correctness, every swept variant (VARIANTS) on the same inputs: select_decode (fused K1
   update) against reference.select_blocks -- exact set and order, random and tied keys,
   contexts just past dense_len, lengths not multiple of the block, one and many gather
   chunks, short rows ranked and radix-selected, up to 1M, all in a page table as wide as the timed 1M one (so the checks compile the kernels
   the timings use); and the whole sparse decode output at 128K against the reference paged
   attention over the reference selection;
2. per layer at 1M + 100 and 128K + 100 tokens (not a power-of-two block count, as most
   contexts are) inside a 1M-wide page table (and, without --quick, exactly 128K,
   and 128K + 100 in a table as wide as the context): dense us; sparse total us = fused selection + attention, and its
   parts (compress alone, selection without / with the fused compress, attention over the
   selected blocks); ratio to dense; the selection with every score tied (zero compressed keys)
   and with scores varying smoothly along the row (smooth_keys).
   Each timing is the median over replays of a CUDA graph of 20 calls ("warm": K1 may sit in
   L2; "cold", without --quick or with --cold: a 64 MB read of another buffer before each call
   (4 rotating), its own time subtracted; the engine's other layers run between a layer's calls,
   so cold is what a step sees).
3. the selection (fused K1) of every variant in VARIANTS (SelectionTuning knobs; "default" =
   gpu.DECODE_TUNING) at both contexts -- the numbers to set SelectionTuning's defaults from.
--quick: bf16 checks only, no cold timings, no context-wide-table case (< 60 s on an H200).
--batch: batch sizes; each size > 1 adds the 1M + 100 and 128K + 100 cases with that many rows
(everything but the tied and smooth selections).
--variants: comma-separated substrings; only VARIANTS whose name holds one are compiled, checked
and timed ("default" always is; "none" alone: the default only; a substring matching no name is an
error). --breakdown: also each variant's device time per kernel
(torch.profiler over eager calls), printed as "kernels[variant]" in the JSON lines.
--attn-splits: the sparse total again with the attention over the selected blocks split that many
ways (the engine uses choose_splits: 96 at batch 1), as "sparse_total[splits N]_us".
--layout: the timed page tables' pages in random order (default) or consecutive (each row one
contiguous range, as the engine's allocator gives a request in a fresh pool).
--attn-defaults: DecodeConfig fields over every default config of the attention (dense and sparse).
--phases: also the sparse total with only its first k kernels launched (k = 1..6: lse + K1 update,
score words, gather, rank, attention split, merge; the later ones skipped), warm and cold, as
"phases_us" / "phases_cold_us": T(k) - T(k-1) is what phase k adds inside the graph, PDL overlap
included (a phase timed alone does not show that).
Results: tables on stdout (last) and DIR/sparse_decode_bench.json ($OUT or ./out).
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import math
import os
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import timing
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def graph_time(fn, flush=None) -> float:
    return timing.graph_time(fn, inner=20, reps=30, flush=flush)


def checks(cfg, quick):
    from salactl.runtime.ops.selection.check import check_decode_selection

    sc, hq, hkv, d = cfg.sparse_config, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    dl, B = sc.dense_len, sc.block_size
    width = (1 << 20) // B + 4                   # the timed 1M table: same compiled kernels
    tunes = [kw for _, kw in VARIANTS] + [dict(rank_short_rows=64)]     # short rows ranked too
    rows = []
    lens = [dl, dl + 1, dl + 37, 3 * dl + B - 1, 50001, 140001]
    for ties in (False, True):
        rows += check_decode_selection("cuda", torch.bfloat16, hq, hkv, d, sc, lens, ties=ties, seed=1 + ties,
                                       width=width, tunes=tunes)
    rows += check_decode_selection("cuda", torch.bfloat16, hq, hkv, d, sc, [(1 << 20) - 5], seed=4,
                                   width=width, tunes=tunes)
    if not quick:
        rows += check_decode_selection("cuda", torch.bfloat16, hq, hkv, d, sc, lens[:5], ties=True, seed=2,
                                       nbc=32, gather_chunk=128, num_warps=4)
        for ties in (False, True):
            rows += check_decode_selection("cuda", torch.float32, hq, hkv, d, sc, lens, ties=ties, seed=3,
                                           tunes=[{}, dict(gather_chunk=256, short_blocks=0)])
    rows.append(("sparse decode output at 128K vs reference (rel err)", end_to_end(cfg, 131072), 1e-2))
    return rows


def one_row_keys(cfg, ctx, device="cuda", dtype=torch.bfloat16):
    """One sequence of ctx random keys in a 1M-wide page table (the precompiled specialisation)
    with its compressed keys from the reference: (pt, k_pages, k1_pages, K1 [windows, Hkv, d])."""
    from salactl.runtime.ops.selection.check import contiguous_keys, paged_keys, window_slots
    from salactl.runtime.ops.selection.reference import compress_keys, num_windows

    sc, hkv, d = cfg.sparse_config, cfg.num_key_value_heads, cfg.head_dim
    pt, kp = paged_keys([ctx], hkv, d, sc.block_size, dtype, device, gen=torch.Generator().manual_seed(5),
                        width=(1 << 20) // sc.block_size + 4)
    nw = num_windows(ctx, sc)
    k1p = torch.zeros(kp.shape[0], hkv, sc.block_size // sc.kernel_stride, d, device=device, dtype=kp.dtype)
    K1 = compress_keys(contiguous_keys(kp, pt[0], ctx, sc.block_size), sc, 0, nw)
    pg, sl = window_slots(pt[0], nw, sc)
    k1p[pg, :, sl] = K1
    return pt, kp, k1p, K1


def end_to_end(cfg, ctx, device="cuda", dtype=torch.bfloat16) -> float:
    from salactl.runtime.ops.decode_attention.reference import paged_attention as ref_attention
    from salactl.runtime.ops.decode_attention.config import choose_splits
    from salactl.runtime.ops.decode_attention.triton import paged_attention
    from salactl.runtime.ops.selection.gpu import select_decode
    from salactl.runtime.ops.selection.reference import select_blocks

    sc, hq, hkv, d = cfg.sparse_config, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    pt, kp, k1p, K1 = one_row_keys(cfg, ctx, device, dtype)
    vp = torch.randn_like(kp)
    q = torch.randn(1, hq, d, device=device, dtype=dtype)
    one = torch.zeros(1, dtype=torch.int32, device=device)
    seq = torch.tensor([ctx], dtype=torch.int32, device=device)
    sel, cnt = select_decode(q, k1p, pt, one, seq, sc, pt.shape[1])
    out = paged_attention(q, kp, vp, pt, one, seq, sel, cnt, sc.dense_len,
                          num_splits=choose_splits(hkv, sc.selected_blocks))
    nb = math.ceil(ctx / sc.block_size)
    mask = select_blocks(q, K1, torch.tensor([ctx - 1], device=device), sc, nb)[:, 0]   # [hkv, nb]
    k = sc.selected_blocks
    ids = torch.zeros(1, hkv, k, dtype=torch.int32, device=device)
    num = torch.zeros(1, hkv, dtype=torch.int32, device=device)
    for h in range(hkv):
        b = torch.nonzero(mask[h]).flatten()
        ids[0, h, :len(b)], num[0, h] = b.to(torch.int32), len(b)
    ref = ref_attention(q, kp, vp, pt, one, seq, ids, num, sc.dense_len).float()
    return float((out.float() - ref).norm() / ref.norm())


def smooth_keys(k1p, pages):
    """K1 pages whose scores vary slowly along each row (window j: sin(j / 3200) times one
    direction; pages [rows, P] in row order): the K-th best blocks sit among thousands of near
    neighbours, the second-level histogram's case; random keys crowd into a few 12-bit bins instead."""
    wpp = k1p.shape[2]
    j = torch.arange(pages.shape[1], device=k1p.device)[:, None] * wpp + torch.arange(wpp, device=k1p.device)
    v = torch.randn(k1p.shape[-1], device=k1p.device)
    out = torch.zeros_like(k1p)
    out[pages.long().flatten()] = (torch.sin(j / 3200.0)[:, None, :, None] * 4 * v / v.norm()).to(k1p.dtype).repeat(
        pages.shape[0], 1, 1, 1)
    return out


def rotating_read(bufs):
    """A flush that reads the next of `bufs` (each call a different buffer): L2 then holds clean
    lines of other data, as when the engine's other layers run between a layer's calls. (A
    zero_() flush leaves ~50 MB of dirty lines, whose write-back the timed call would pay.)"""
    calls = itertools.count()
    return lambda: bufs[next(calls) % len(bufs)].amax()


class _Skipped:
    """Stands in for a Triton kernel whose launches are skipped."""
    def __getitem__(self, grid):
        return lambda *args, **kwargs: None


def sparse_phases():
    """(name, module, kernel attribute) of the sparse decode path's launches in order."""
    from salactl.runtime.ops.decode_attention import triton as attn
    from salactl.runtime.ops.selection import triton_decode as dkern
    from salactl.runtime.ops.selection import triton_rank as rkern
    return [("lse + K1", dkern, "_lse_kernel"), ("score words", dkern, "_block_words_kernel"),
            ("gather", rkern, "_gather_kernel"), ("rank", rkern, "_rank_kernel"),
            ("attention split", attn, "_split_kernel"), ("merge", attn, "_merge_kernel")]


@contextlib.contextmanager
def first_phases(k: int):
    """Launch only the first k kernels of sparse_phases() inside the block."""
    later = [(mod, name, getattr(mod, name)) for _, mod, name in sparse_phases()[k:]]
    for mod, name, _ in later:
        setattr(mod, name, _Skipped())
    try:
        yield
    finally:
        for mod, name, kernel in later:
            setattr(mod, name, kernel)


def paged_rows(cfg, ctx, batch, width, layout="random"):
    """`batch` rows of ctx random bf16 keys each in a page table `width` blocks wide (pages in
    random or consecutive order), their K1 compressed by the GPU kernel, a random q and the K1
    update a decode token at ctx makes (jstart, jcount): a SimpleNamespace (P: pages per row,
    pool: pages in all; the pool's last page is the table's filler)."""
    from salactl.runtime.ops.selection.gpu import compress_update

    sc, hq, hkv, d = cfg.sparse_config, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    B = sc.block_size
    P = ctx // B + 2
    pool = batch * P
    kp = torch.randn(pool + 1, hkv, B, d, device="cuda", dtype=torch.bfloat16)
    k1p = torch.zeros(pool + 1, hkv, B // sc.kernel_stride, d, device="cuda", dtype=torch.bfloat16)
    pt = torch.full((batch, width), pool, dtype=torch.int32, device="cuda")
    order = torch.randperm(pool, device="cuda") if layout == "random" else torch.arange(pool, device="cuda")
    pt[:, :P] = order.to(torch.int32).view(batch, P)
    slots = torch.arange(batch, dtype=torch.int32, device="cuda")
    seq = torch.full((batch,), ctx, dtype=torch.int32, device="cuda")
    nw = (ctx - sc.kernel_size) // sc.kernel_stride + 1
    done = int((ctx - sc.kernel_size) % sc.kernel_stride == 0)
    rows_of = lambda v: torch.full((batch,), v, dtype=torch.int32, device="cuda")  # noqa: E731
    compress_update(kp, k1p, pt, slots, rows_of(0), rows_of(nw), nw, sc)
    q = torch.randn(batch, hq, d, device="cuda", dtype=torch.bfloat16)
    return SimpleNamespace(kp=kp, k1p=k1p, pt=pt, slots=slots, seq=seq, q=q, jstart=rows_of(nw - done),
                           jcount=rows_of(done), nw=nw, P=P, pool=pool)


def layer_case(cfg, ctx, width, flush_bufs, variants, breakdown=False, batch=1, attn_splits=(), layout="random",
               phases=False):
    """Timings (us) of one layer's decode attention for `batch` rows at context `ctx` each, page
    table `width` wide (the tied / smooth selections at batch 1 only); attn_splits: also the
    sparse total with the attention split that many ways (the engine: choose_splits)."""
    from salactl.runtime.ops.decode_attention.config import choose_splits
    from salactl.runtime.ops.decode_attention.triton import paged_attention
    from salactl.runtime.ops.selection.gpu import DECODE_TUNING, compress_update, select_decode

    sc, hkv = cfg.sparse_config, cfg.num_key_value_heads
    n = batch
    rows = paged_rows(cfg, ctx, n, width, layout)
    kp, k1p, pt, slots, seq, q, jstart, jcount, P = (rows.kp, rows.k1p, rows.pt, rows.slots, rows.seq, rows.q,
                                                     rows.jstart, rows.jcount, rows.P)
    vp = torch.randn_like(kp)
    nb = pt.shape[1]
    dense_splits = choose_splits(n * hkv, P)
    sparse_splits = choose_splits(n * hkv, sc.selected_blocks)
    sel0, cnt0 = select_decode(q, k1p, pt, slots, seq, sc, nb)

    fns = {
        "dense": lambda: paged_attention(q, kp, vp, pt, slots, seq, num_splits=dense_splits),
        "compress": lambda: compress_update(kp, k1p, pt, slots, jstart, jcount, 1, sc),
        "selection": lambda: select_decode(q, k1p, pt, slots, seq, sc, nb),
        "selection_fused_k1": lambda: select_decode(q, k1p, pt, slots, seq, sc, nb, k_pages=kp,
                                                    k1_start=jstart, k1_count=jcount),
        "attention": lambda: paged_attention(q, kp, vp, pt, slots, seq, sel0, cnt0, sc.dense_len,
                                             num_splits=sparse_splits),
    }

    def sparse_total():
        sel, cnt = fns["selection_fused_k1"]()
        paged_attention(q, kp, vp, pt, slots, seq, sel, cnt, sc.dense_len, num_splits=sparse_splits)

    def sparse_unfused():
        fns["compress"]()
        sel, cnt = fns["selection"]()
        paged_attention(q, kp, vp, pt, slots, seq, sel, cnt, sc.dense_len, num_splits=sparse_splits)

    fns["sparse_total"] = sparse_total
    for sp in attn_splits:
        def split_total(sp=sp):
            sel, cnt = fns["selection_fused_k1"]()
            paged_attention(q, kp, vp, pt, slots, seq, sel, cnt, sc.dense_len, num_splits=sp)
        fns[f"sparse_total[splits {sp}]"] = split_total
    fns["sparse_unfused"] = sparse_unfused
    out = {"ctx": ctx, "batch": n, "table_blocks": width}
    flush = rotating_read(flush_bufs) if flush_bufs is not None else None
    t_flush = graph_time(flush) if flush else 0.0
    for name, fn in fns.items():
        out[f"{name}_us"] = graph_time(fn) * 1e6
        if flush:
            out[f"{name}_cold_us"] = (graph_time(fn, flush=flush) - t_flush) * 1e6
    for tag in ("", "_cold"):
        if f"dense{tag}_us" in out:
            out[f"ratio{tag}"] = out[f"sparse_total{tag}_us"] / out[f"dense{tag}_us"]
    if phases:
        for tag, fl in (("", None), ("_cold", flush)) if flush else (("", None),):
            ts = []
            for k in range(1, len(sparse_phases()) + 1):
                with first_phases(k):
                    ts.append((graph_time(sparse_total, flush=fl) - (t_flush if fl else 0.0)) * 1e6)
            out[f"phases{tag}_us"] = [round(t, 2) for t in ts]
    if n == 1:
        k1z = torch.zeros_like(k1p)       # every score equal: the top-k's tie path on every block
        out["selection_all_tied_us"] = graph_time(lambda: select_decode(q, k1z, pt, slots, seq, sc, nb)) * 1e6
        k1s = smooth_keys(k1p, pt[:, :P])
        out["selection_smooth_us"] = graph_time(lambda: select_decode(q, k1s, pt, slots, seq, sc, nb)) * 1e6
    for name, kw in [("default", {})] + variants:
        def sel(tuning=DECODE_TUNING.with_knobs(**kw)):
            return select_decode(q, k1p, pt, slots, seq, sc, nb, k_pages=kp, k1_start=jstart, k1_count=jcount,
                                 tuning=tuning)
        if name != "default":
            out[f"sel[{name}]_us"] = graph_time(sel) * 1e6
            if flush:
                out[f"sel[{name}]_cold_us"] = (graph_time(sel, flush=flush) - t_flush) * 1e6
        if breakdown:
            out[f"kernels[{name}]_us"] = {k: round(v, 2) for k, v in timing.kernel_times(sel).items()}
    return out


# Selection variants swept (and checked): SelectionTuning knobs over gpu.DECODE_TUNING.
VARIANTS = [("default", {}),
            ("lse splits 128", dict(lse_splits=128)),
            ("lse splits 64", dict(lse_splits=64)),
            # the top-k by counting ranks (triton_rank.py): RB keys per
            # program and step against CT-wide tiles; long rows gathered first (gather_chunk
            # blocks per program); short rows ranked up to rank_short_rows rows (default 4),
            # else the one-program radix select (triton_radix.py)
            ("small off", dict(short_blocks=0)),            # every row gathered, then ranked
            ("rank short rows", dict(rank_short_rows=64)),
            ("radix short rows", dict(rank_short_rows=0)),
            ("radix w4", dict(rank_short_rows=0, radix_warps=4)),
            ("radix w16", dict(rank_short_rows=0, radix_warps=16)),
            ("rank rb16 w4", dict(rank_rb=16, rank_warps=4)),
            ("rank rb16 w4 short rows", dict(rank_rb=16, rank_warps=4, rank_short_rows=64)),
            ("rank rb8 w4", dict(rank_rb=8, rank_warps=4)),
            ("rank rb64", dict(rank_rb=64)),
            ("rank ct512", dict(rank_ct=512)),
            ("rank ct128 rb16", dict(rank_ct=128, rank_rb=16)),
            ("gather ch512", dict(gather_chunk=512)),
            ("gather ch2048", dict(gather_chunk=2048)),
            # pass 2 adds one atomic per distinct histogram bin of its program (the default);
            # "no dedup" is one atomic per block
            ("no dedup", dict(dedup=False)),
            # the lse pass's windows per step, warps and pipeline stages (default 128, 4, 2)
            ("lse bw64", dict(lse_bw=64)),
            ("lse bw128 w8", dict(lse_warps=8)),
            ("lse bw64 w8", dict(lse_bw=64, lse_warps=8)),
            ("lse bw32", dict(lse_bw=32)),
            ("lse bw64 st2", dict(lse_bw=64, lse_stages=2)),
            ("lse bw64 st4", dict(lse_bw=64, lse_stages=4)),
            ("lse bw32 st4", dict(lse_bw=32, lse_stages=4)),
            ("lse bw128 st3", dict(lse_stages=3)),
            ("lse bw128 st4", dict(lse_stages=4)),
            ("lse bw256 w8", dict(lse_bw=256, lse_warps=8)),
            ("lse bw256 w8 st2", dict(lse_bw=256, lse_warps=8, lse_stages=2)),
            # the default keeps one online softmax per (head, window slot), merged at the end: no
            # reduction across warps per step; "lse per row" reduces per row at each step
            ("lse per row", dict(lse_elem=False)),
            ("lse elem st3", dict(lse_stages=3)),
            ("lse elem bw64", dict(lse_bw=64)),
            # pass 2's warps and blocks per program with the top-k's warps unchanged (8)
            ("p2 nbc64 w4", dict(nbc=64, num_warps=4)),
            ("p2 nbc16 w2", dict(nbc=16, num_warps=2)),
            ("p2 nbc16 w4", dict(nbc=16, num_warps=4)),
            ("p2 nbc64 w8", dict(nbc=64, num_warps=8)),
            ("p2 nbc128 w8", dict(nbc=128, num_warps=8)),
            # pass 2's K1 scores before its PDL wait (p2_early, the default, with 4 warps in wide
            # tables too); "late" computes them after the wait, "late w2" also on 2 warps
            ("late", dict(p2_early=False)),
            ("late w2", dict(p2_early=False, num_warps=2)),
            ("early w2", dict(num_warps=2)),
            ("early lse192", dict(lse_splits=192)),
            ("early nbc64 w8", dict(nbc=64, num_warps=8))]
# Variants measured and no longer in this list: BENCHMARKS.md, "Tuning notes moved from code comments".


def _compile_worker(tunes: list) -> list[str]:
    """JIT (into Triton's disk cache) select_decode with each knob dict, fused K1 and not, at the
    benchmark's specialisation (bf16, sala-9b heads, the 1M-wide page table) on a tiny pool."""
    from salactl.runtime.ops.selection.gpu import DECODE_TUNING, select_decode
    from salactl.runtime.presets import sala_9b

    torch.cuda.init()
    cfg = sala_9b()
    sc, hq, hkv, d = cfg.sparse_config, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    B = sc.block_size
    width = (1 << 20) // B + 4
    kp = torch.randn(8, hkv, B, d, device="cuda", dtype=torch.bfloat16)
    k1p = torch.zeros(8, hkv, B // sc.kernel_stride, d, device="cuda", dtype=torch.bfloat16)
    pt = torch.zeros(1, width, dtype=torch.int32, device="cuda")
    one = torch.zeros(1, dtype=torch.int32, device="cuda")
    seq = torch.tensor([300], dtype=torch.int32, device="cuda")
    q = torch.randn(1, hq, d, device="cuda", dtype=torch.bfloat16)
    fails = []
    for tn in tunes:
        try:
            tuning = DECODE_TUNING.with_knobs(**tn)
            select_decode(q, k1p, pt, one, seq, sc, width, k_pages=kp, k1_start=one, k1_count=one, tuning=tuning)
            select_decode(q, k1p, pt, one, seq, sc, width, tuning=tuning)
        except Exception as ex:      # the checks run it again and report
            fails.append(f"{tn}: {type(ex).__name__}: {str(ex)[:200]}")
    torch.cuda.synchronize()
    return fails


def precompile(tunes: list) -> None:
    """Compile every variant in parallel processes first (the run is JIT-bound otherwise)."""
    import concurrent.futures as cf
    import multiprocessing as mp

    t0 = time.perf_counter()
    workers = max(1, min(len(tunes), (os.cpu_count() or 2) - 1, 12))
    chunks = [tunes[i::workers] for i in range(workers)]
    try:
        with cf.ProcessPoolExecutor(workers, mp_context=mp.get_context("spawn")) as ex:
            for fails in ex.map(_compile_worker, chunks):
                for f in fails:
                    print(f"  precompile failed: {f}", flush=True)
    except Exception as ex:          # serial JIT in the checks instead
        print(f"parallel precompile failed ({type(ex).__name__}: {ex})", flush=True)
    print(f"precompiled {len(tunes)} selection variants in {workers} processes "
          f"({time.perf_counter() - t0:.0f} s)", flush=True)


def set_defaults(text: str) -> None:
    """'name=value,...' into gpu.DECODE_TUNING (bools where the default is one, else ints where
    the value is a number)."""
    import dataclasses

    from salactl.runtime.ops.selection import gpu
    from salactl.runtime.ops.selection.tuning import knob_names

    knobs = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, _, val = part.partition("=")
        if name not in knob_names():
            raise SystemExit(f"--defaults: unknown knob {name!r}; known: {', '.join(knob_names())}")
        number = val.lstrip("-").isdigit()
        is_bool = isinstance(getattr(gpu.DECODE_TUNING, name), bool)
        knobs[name] = bool(int(val)) if is_bool else int(val) if number else val
    gpu.DECODE_TUNING = gpu.DECODE_TUNING.with_knobs(**knobs)
    print(f"defaults: {dataclasses.asdict(gpu.DECODE_TUNING)}", flush=True)


def set_attn_defaults(text: str) -> None:
    """'field=value,...' into every DecodeConfig of decode_attention.config.DEFAULT_CONFIGS (the
    split kernel's launch config for dense and sparse rows)."""
    import dataclasses

    from salactl.runtime.ops.decode_attention import config

    fields = [f.name for f in dataclasses.fields(config.DecodeConfig)]
    kw = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, _, val = part.partition("=")
        if name not in fields:
            raise SystemExit(f"--attn-defaults: unknown field {name!r}; known: {', '.join(fields)}")
        kw[name] = bool(int(val)) if isinstance(getattr(config.DecodeConfig(), name), bool) else int(val)
    for key, cfg in config.DEFAULT_CONFIGS.items():
        config.DEFAULT_CONFIGS[key] = dataclasses.replace(cfg, **kw)
    print(f"attention defaults: {config.DEFAULT_CONFIGS}", flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true",
                    help="bf16 checks only, no cold timings, no context-wide-table case")
    ap.add_argument("--skip-checks", action="store_true")
    ap.add_argument("--variants", default="",
                    help="comma-separated name substrings: sweep only those VARIANTS (default: all)")
    ap.add_argument("--breakdown", action="store_true",
                    help="also each selection variant's time per kernel (torch.profiler, eager calls)")
    ap.add_argument("--batch", default="1",
                    help="comma-separated batch sizes for the per-layer cases (rows of equal context)")
    ap.add_argument("--attn-splits", default="",
                    help="comma-separated split counts: also the sparse total with the attention split that way")
    ap.add_argument("--layout", choices=("random", "sequential"), default="random",
                    help="page order of the timed page tables (sequential: one contiguous range per row)")
    ap.add_argument("--defaults", default="",
                    help="select_decode knobs to use as the defaults of this run, e.g. lse_bw=64,nbc=16")
    ap.add_argument("--attn-defaults", default="",
                    help="DecodeConfig fields for every default attention config of this run, e.g. preload=16")
    ap.add_argument("--phases", action="store_true",
                    help="also the sparse total with only its first k kernels launched (what each phase adds)")
    ap.add_argument("--cold", action="store_true",
                    help="with --quick: the cold timings too (64 MB read before each call), variants included")
    ap.add_argument("--out", default=os.environ.get("OUT", "out"))
    args = ap.parse_args()
    from salactl.runtime.presets import sala_9b

    if args.defaults:
        set_defaults(args.defaults)
    if args.attn_defaults:
        set_attn_defaults(args.attn_defaults)
    global VARIANTS
    if args.variants:
        wanted = [w.strip() for w in args.variants.split(",") if w.strip()]
        names = [name for name, _ in VARIANTS[1:]]
        unmatched = [w for w in wanted if w != "none" and not any(w in name for name in names)]
        if unmatched:
            raise SystemExit(f"--variants: {unmatched} match no variant; names: {', '.join(names)}; "
                             "'none' times the default only")
        VARIANTS = VARIANTS[:1] + [v for v in VARIANTS[1:] if any(w in v[0] for w in wanted if w != "none")]
    if not torch.cuda.is_available():
        sys.exit("sparse_decode_bench.py: needs a CUDA GPU")
    cfg = sala_9b()
    res = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
           "triton": __import__("triton").__version__}
    t0 = time.perf_counter()
    bad = []
    precompile([kw for _, kw in VARIANTS])
    if not args.skip_checks:
        rows = checks(cfg, args.quick)
        bad = [r for r in rows if not r[1] <= r[2]]
        for r in rows:
            ok = "ok  " if r[1] <= r[2] else "FAIL"
            print(f"{ok} {r[0][:150]:150s} {r[1]:.3e} (tol {r[2]:.0e})", flush=True)
        res["checks"] = {"passed": len(rows) - len(bad), "failed": bad}
        print(f"checks: {len(rows) - len(bad)} ok, {len(bad)} failed ({time.perf_counter() - t0:.0f} s)", flush=True)
    cold = args.cold or not args.quick
    flush_bufs = [torch.ones(64 << 20, dtype=torch.uint8, device="cuda") for _ in range(4)] if cold else None
    variants = VARIANTS[1:]
    B = cfg.sparse_config.block_size
    # a context just past a power-of-two block count, as most are
    off = 100
    cases = [((1 << 20) + off, (1 << 20) // B + 4, 1), (131072 + off, (1 << 20) // B + 4, 1)]
    if not args.quick:
        cases += [(131072, (1 << 20) // B + 4, 1), (131072 + off, 131072 // B + 4, 1)]
    for n in (int(b) for b in args.batch.split(",") if int(b) > 1):
        cases += [((1 << 20) + off, (1 << 20) // B + 4, n), (131072 + off, (1 << 20) // B + 4, n)]
    if "1" not in args.batch.split(","):
        cases = [c for c in cases if c[2] > 1]
    splits = [int(v) for v in args.attn_splits.split(",") if v.strip()]
    res["cases"] = []
    for ctx, width, n in cases:
        c = layer_case(cfg, ctx, width, flush_bufs, variants, args.breakdown, n, splits, args.layout, args.phases)
        torch.cuda.empty_cache()
        res["cases"].append(c)
        print(json.dumps({k: (round(v, 2) if isinstance(v, float) else v) for k, v in c.items()}), flush=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "sparse_decode_bench.json").write_text(json.dumps(res, indent=1, default=str))
    if variants:
        cs = res["cases"]
        print("\n| selection variant (fused K1), us | " + " | ".join(
            f"{c['ctx'] // 1024}K b{c['batch']} in {c['table_blocks']}" for c in cs) + " |")
        print("|---|" + "---|" * len(cs))
        def cell(c, key):
            warm = f"{c.get(key + '_us', float('nan')):.1f}"
            return warm + (f" / {c[key + '_cold_us']:.1f} cold" if key + "_cold_us" in c else "")
        print("| default | " + " | ".join(cell(c, "selection_fused_k1") for c in cs) + " |")
        for name, _ in variants:
            print(f"| {name} | " + " | ".join(cell(c, f"sel[{name}]") for c in cs) + " |")
    print("\n| ctx | batch | table blocks | dense us | sparse total us | compress | selection (fused K1) "
          "| selection alone | attention | sparse/dense | cold: dense / sparse / ratio |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for c in res["cases"]:
        cold = "-"
        if "ratio_cold" in c:
            cold = f"{c['dense_cold_us']:.1f} / {c['sparse_total_cold_us']:.1f} / {100 * c['ratio_cold']:.0f}%"
        print(f"| {c['ctx']} | {c['batch']} | {c['table_blocks']} | {c['dense_us']:.1f} | {c['sparse_total_us']:.1f} | "
              f"{c['compress_us']:.1f} | {c['selection_fused_k1_us']:.1f} | {c['selection_us']:.1f} | "
              f"{c['attention_us']:.1f} | {100 * c['ratio']:.1f}% | {cold} |")
    if splits:
        print("\n| ctx | batch | " + " | ".join(f"sparse total, {sp} splits" for sp in splits) + " |")
        print("|---|---|" + "---|" * len(splits))
        for c in res["cases"]:
            print(f"| {c['ctx']} | {c['batch']} | " + " | ".join(
                f"{c[f'sparse_total[splits {sp}]_us']:.1f}" for sp in splits) + " |")
    if args.phases:
        names = [p[0] for p in sparse_phases()]
        print("\n| ctx | batch | " + " | ".join(f"+ {nm}" for nm in names) + " |")
        print("|---|---|" + "---|" * len(names))
        for c in res["cases"]:
            for tag in ("", "_cold"):
                if f"phases{tag}_us" in c:
                    ts = c[f"phases{tag}_us"]
                    cells = [f"{t:.1f} (+{t - (ts[i - 1] if i else 0.0):.1f})" for i, t in enumerate(ts)]
                    print(f"| {c['ctx']}{' cold' if tag else ''} | {c['batch']} | " + " | ".join(cells) + " |")
    print(f"\ntotal {time.perf_counter() - t0:.0f} s; checks {'FAILED' if bad else 'ok'}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())

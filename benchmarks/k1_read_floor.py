"""The read floor of the decode selection's lse pass: how fast any kernel can read one layer's
compressed keys (K1) through the page table, against the lse pass itself (the sparse /
dense target, whose 1M batch-1 gap is mostly the two K1 passes).

    cd benchmarks && python k1_read_floor.py [--contexts 1048676,131172] [--batch 1,2]
        [--layout random|sequential] [--pool page-major|head-major] [--out DIR]

Per context and batch (sala-9b: Hkv 2, d 128, bf16 K1, pages of 64 tokens in random order in a
1M-wide table, as sparse_decode_bench.py), warm and cold (a 64 MB read of another buffer before
each call, its own time subtracted), us per call from CUDA-graph replays of 20 calls:
- `lse pass`: select_decode with the fused K1 update, only its first launch (the bench's phase 1);
- `paged floor`: the fastest of PAGED_CONFIGS, a kernel that only reads each row's visible K1
  (1 KB per page and KV head) through the page table and xors it into one word per program,
  PDL-launched with its wait first, like the lse pass;
- `twice`: that fastest config launched twice in a row, the floor of the selection's two K1 passes
  (the second read may find part of K1 in L2, as pass 2 does);
- `contiguous floor`: read_floor.py's floor for the same bytes in one flat buffer.
If the paged floor is close to the lse pass, the pass is at what its access pattern allows.
--layout sequential: each row's pages in order (random by default, as a long-running pool gives);
--pool head-major: the floor reads a [Hkv, P, windows, d] pool instead of the engine's
[P, Hkv, windows, d] (so one KV head's K1 of consecutive pages is contiguous; the lse pass
still reads the engine's layout): what a K1 layout of long contiguous runs would allow.

Hand-written because the floor must be a plain Triton kernel with our launch path and page-table
indirection (no library reads through a page table).
Results: a table on stdout (last) and DIR/k1_read_floor_LAYOUT_POOL.json ($OUT or ./out).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import torch
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from read_floor import read_floor_us  # noqa: E402
from sparse_decode_bench import first_phases, graph_time, paged_rows, rotating_read  # noqa: E402

from salactl.runtime.ops.pdl import launch_args, pdl_wait  # noqa: E402

# (splits per row, pages per step, warps, pipeline stages)
PAGED_CONFIGS = ((128, 32, 4, 3), (256, 32, 4, 3), (256, 32, 4, 2), (256, 16, 4, 3), (256, 64, 8, 3),
                 (512, 16, 4, 3), (512, 32, 4, 2), (256, 32, 8, 4), (128, 64, 8, 3), (1024, 16, 4, 2))


@triton.jit
def _paged_read_kernel(k1_ptr, pt_ptr, npages, s_1p, s_1h, s_pt, out_ptr, HKV: tl.constexpr,
                       W: tl.constexpr, PB: tl.constexpr, STAGES: tl.constexpr, PDL: tl.constexpr = False):
    """Program (row, split): xor of the int32 words of its share of the row's pages' K1 (W words
    per page and KV head), pages looked up in the row's page-table line."""
    pdl_wait(PDL)
    r = tl.program_id(0)
    sp = tl.program_id(1)
    n = r // HKV
    kh = r % HKV
    per = tl.cdiv(tl.cdiv(npages, tl.num_programs(1)), PB) * PB
    start = sp * per
    end = tl.minimum(start + per, npages)
    acc = tl.zeros([PB, W], tl.int32)
    for p0 in tl.range(start, end, PB, num_stages=STAGES):
        p = p0 + tl.arange(0, PB)
        pm = p < end
        page = tl.load(pt_ptr + n * s_pt + p, mask=pm, other=0).to(tl.int64)
        acc ^= tl.load(k1_ptr + page[:, None] * s_1p + kh * s_1h + tl.arange(0, W)[None, :], mask=pm[:, None],
                       other=0)
    tl.store(out_ptr + r * tl.num_programs(1) + sp, tl.xor_sum(tl.xor_sum(acc, 1), 0))


def paged_read(k1w, pt, npages, out, config):
    """k1w: the K1 pool as int32 words [P, Hkv, W]; pt [n, width] int32."""
    splits, pb, warps, stages = config
    rows = pt.shape[0] * k1w.shape[1]
    _paged_read_kernel[(rows, splits)](k1w, pt, npages, k1w.stride(0), k1w.stride(1), pt.stride(0), out,
                                       HKV=k1w.shape[1], W=k1w.shape[2], PB=pb, STAGES=stages, num_warps=warps,
                                       **launch_args(k1w.device))


def case(cfg, ctx: int, batch: int, flush, layout: str = "random", pool_order: str = "page-major") -> dict:
    from salactl.runtime.ops.selection.gpu import select_decode

    sc, hkv, d = cfg.sparse_config, cfg.num_key_value_heads, cfg.head_dim
    rows = paged_rows(cfg, ctx, batch, (1 << 20) // sc.block_size + 4, layout)
    kp, k1p, pt, slots, seq, q = rows.kp, rows.k1p, rows.pt, rows.slots, rows.seq, rows.q
    wpp = sc.block_size // sc.kernel_stride
    npages = triton.cdiv(rows.nw, wpp)                  # pages holding the row's visible windows
    k1w = k1p.view(torch.int32).view(rows.pool + 1, hkv, wpp * d // 2)
    if pool_order == "head-major":       # same bytes, [Hkv, P, W] in memory, indexed as [P, Hkv, W]
        k1w = k1w.transpose(0, 1).contiguous().transpose(0, 1)
    nbytes = batch * hkv * npages * wpp * d * k1p.element_size()
    out = torch.empty(batch * hkv * max(c[0] for c in PAGED_CONFIGS), dtype=torch.int32, device="cuda")

    def lse_pass():
        with first_phases(1):
            select_decode(q, k1p, pt, slots, seq, sc, pt.shape[1], k_pages=kp, k1_start=rows.jstart,
                          k1_count=rows.jcount)

    t_flush = graph_time(flush)
    res = {"ctx": ctx, "batch": batch, "k1_mb": nbytes / 1e6, "layout": layout, "pool": pool_order}
    for tag, fl in (("", None), ("_cold", flush)):
        sub = t_flush if fl else 0.0
        res[f"lse_pass{tag}_us"] = (graph_time(lse_pass, flush=fl) - sub) * 1e6
        paged = {}
        for c in PAGED_CONFIGS:
            paged["s{} pb{} w{} st{}".format(*c)] = (graph_time(lambda c=c: paged_read(k1w, pt, npages, out, c),
                                                                flush=fl) - sub) * 1e6
        best = min(paged, key=paged.get)
        res[f"paged_floor{tag}_us"], res[f"paged_floor{tag}_config"] = paged[best], best
        c = next(c for c in PAGED_CONFIGS if "s{} pb{} w{} st{}".format(*c) == best)

        def twice(c=c):
            paged_read(k1w, pt, npages, out, c)
            paged_read(k1w, pt, npages, out, c)
        res[f"paged_floor_twice{tag}_us"] = (graph_time(twice, flush=fl) - sub) * 1e6
        res[f"paged{tag}_us"] = {k: round(v, 2) for k, v in paged.items()}
    res["contiguous_floor_us"], res["contiguous_floor_config"] = read_floor_us(nbytes, copies=4, calls=20)
    return res


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--contexts", default="1048676,131172")
    ap.add_argument("--batch", default="1,2")
    ap.add_argument("--layout", choices=("random", "sequential"), default="random")
    ap.add_argument("--pool", choices=("page-major", "head-major"), default="page-major")
    ap.add_argument("--out", default=os.environ.get("OUT", "out"))
    args = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("k1_read_floor.py: needs a CUDA GPU")
    from salactl.runtime.presets import sala_9b

    cfg = sala_9b()
    flush = rotating_read([torch.ones(64 << 20, dtype=torch.uint8, device="cuda") for _ in range(4)])
    rows = []
    for ctx in map(int, args.contexts.split(",")):
        for batch in map(int, args.batch.split(",")):
            r = case(cfg, ctx, batch, flush, args.layout, args.pool)
            print(json.dumps(r), flush=True)
            rows.append(r)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    name = f"k1_read_floor_{args.layout}_{args.pool}.json"
    tmp = out / (name + ".tmp")
    tmp.write_text(json.dumps(rows, indent=1))
    tmp.replace(out / name)
    print(f"\nlayout {args.layout}, pool {args.pool}")
    print("| ctx | batch | K1 MB | lse pass us (warm / cold) | paged floor us (warm / cold) | config (cold) "
          "| twice us (warm / cold) | contiguous floor us | lse pass TB/s cold | paged floor TB/s cold |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['ctx']} | {r['batch']} | {r['k1_mb']:.1f} | {r['lse_pass_us']:.1f} / {r['lse_pass_cold_us']:.1f} "
              f"| {r['paged_floor_us']:.1f} / {r['paged_floor_cold_us']:.1f} | {r['paged_floor_cold_config']} "
              f"| {r['paged_floor_twice_us']:.1f} / {r['paged_floor_twice_cold_us']:.1f} "
              f"| {r['contiguous_floor_us']:.1f} | {r['k1_mb'] / r['lse_pass_cold_us']:.2f} "
              f"| {r['k1_mb'] / r['paged_floor_cold_us']:.2f} |")


if __name__ == "__main__":
    main()

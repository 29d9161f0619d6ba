"""Sparse (InfLLM-V2) prefill attention of one layer on one GPU: today's path (GPU
selection + Triton paged kernel, one query token per row) vs FlexAttention over the same pools
(runtime/ops/attention/flex_sparse.py), sala-9b shapes, bf16.

    python benchmarks/sparse_prefill_bench.py [--n 4096] [--out DIR]

A chunk of n query tokens at positions [C, C+n), C = 28K and 124K (contexts 32K and 128K), in a
paged pool with a random page permutation (one pool sized for 128K, so the compiled flex kernel
sees one shape). K1 windows are compressed once; the per-token selection (real select_paged, in
sub-chunks of 2048 as the engine) is computed once per case. Two query distributions:
"iid" (random queries: scattered, nearly independent selections, worst case for tile unions)
and "local" (queries of each 128-token run = a shared random vector + 0.1 noise: neighbouring
tokens select nearly the same blocks, the favourable case).

1. correctness: every path against reference paged_attention over the same selection on 96
   query rows (first, last, random), and flex on all rows against triton, rel err <= 1e-2
   (fails loudly: FAIL lines, the path is not timed, exit 1);
2. timing (CUDA events, median): triton = paged kernel with num_splits=1 (as the engine);
   flex = compiled flex_attention with q tiles of 128 tokens x 1 head (enable_gqa), flex-fold =
   GQA group folded into the rows (tiles of 8 tokens x 16 heads).
Columns: attn ms = the attention alone (for flex incl. the q/o layout copies; no K/V conversion:
the pool is viewed as one sequence); layout ms = those q/o copies alone (part of attn ms);
+mask ms = plus building the BlockMask from the selection (flex only); total ms = plus the
selection (the engine's whole sparse-prefill cost for the chunk, K1 compression excluded);
blocks/tile = mean 64-token blocks a query tile visits (flex: the union over the tile's tokens;
triton: the selected blocks per token, <= 96); rel err vs the reference.
Results: table LAST on stdout, JSON in DIR/sparse_prefill_bench.json ($OUT or ./out).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path

import timing
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

SUB = 2048
CONTEXTS = (28672, 126976)


def make_queries(n, hq, d, dist, gen, dev, dtype):
    if dist == "iid":
        return torch.randn(n, hq, d, generator=gen, device=dev).to(dtype)
    base = torch.randn(math.ceil(n / 128), 1, hq, d, generator=gen, device=dev)
    noise = torch.randn(base.shape[0], 128, hq, d, generator=gen, device=dev)
    return (base + 0.1 * noise).reshape(-1, hq, d)[:n].to(dtype)


def measure(fn, dev) -> float:
    """Median ms (CUDA events); on CPU (--smoke) one timed call, only to exercise the code."""
    if dev == "cuda":
        return timing.events_time(fn, reps=10) * 1e3
    t = time.perf_counter()
    fn()
    return (time.perf_counter() - t) * 1e3


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=4096, help="query tokens per chunk (multiple of 2048)")
    ap.add_argument("--out", default=os.environ.get("OUT", "out"))
    ap.add_argument("--paths", default="triton,flex,flex-fold",
                    help="comma list of paths to check and time (triton is the reference for all-row checks)")
    ap.add_argument("--smoke", action="store_true",
                    help="CPU run of the whole script at tiny shapes (sets TRITON_INTERPRET=1, eager flex; "
                         "Triton 3.6's interpreter needs numpy<2.4)")
    args = ap.parse_args()
    global SUB, CONTEXTS
    dev, dtype = ("cpu", torch.float32) if args.smoke else ("cuda", torch.bfloat16)
    if args.smoke:
        SUB, CONTEXTS, args.n = 128, (256,), 128
        # before the kernel modules below are imported: their @triton.jit reads it then
        os.environ["TRITON_INTERPRET"] = "1"
    from salactl.runtime.ops.attention import flex_sparse as fs
    from salactl.runtime.ops.decode_attention.reference import paged_attention as ref_attention
    from salactl.runtime.ops.decode_attention.triton import paged_attention
    from salactl.runtime.ops.selection.gpu import compress_update, select_paged
    from salactl.runtime.ops.selection.reference import num_windows
    from salactl.runtime.presets import sala_9b

    t0 = time.perf_counter()
    cfg = sala_9b()
    if args.smoke:
        import dataclasses
        cfg = dataclasses.replace(cfg, num_attention_heads=8, head_dim=32, lightning_nh=8, lightning_nkv=8,
                                  lightning_head_dim=32, sparse_config=dataclasses.replace(
            cfg.sparse_config, block_size=16, kernel_size=8, kernel_stride=4, topk=4, window_size=32))
    sc, hq, hkv, d = cfg.sparse_config, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    B, n = sc.block_size, args.n
    P = math.ceil((max(CONTEXTS) + n) / B) + 2
    gen = torch.Generator(device=dev).manual_seed(0)
    kp = torch.randn(P, hkv, B, d, device=dev, generator=gen).to(dtype)
    vp = torch.randn(P, hkv, B, d, device=dev, generator=gen).to(dtype)
    pt = torch.full((2, P), P - 1, dtype=torch.int32, device=dev)
    pt[0, :P - 1] = torch.randperm(P - 1, device=dev, generator=gen).to(torch.int32)
    k1p = torch.zeros(P, hkv, B // sc.kernel_stride, d, device=dev, dtype=dtype)
    nw = num_windows(max(CONTEXTS) + n, sc)
    zero = torch.zeros(1, dtype=torch.int32, device=dev)
    compress_update(kp, k1p, pt, zero, zero, torch.tensor([nw], dtype=torch.int32, device=dev), nw, sc)
    if args.smoke:
        from torch.nn.attention.flex_attention import flex_attention as flex
    else:
        flex = fs.compiled_flex()
        import torch._dynamo as dynamo       # a recompile storm must raise, not run flex unfused (OOM)
        if hasattr(dynamo.config, "fail_on_recompile_limit_hit"):
            dynamo.config.fail_on_recompile_limit_hit = True
    res = {"gpu": torch.cuda.get_device_name() if dev == "cuda" else "cpu", "torch": torch.__version__, "n": n, "rows": []}
    bad = []

    for C in CONTEXTS:
        pos = C + torch.arange(n, device=dev, dtype=torch.int32)
        slots = torch.zeros(n, dtype=torch.int32, device=dev)
        lens = pos + 1
        for dist in ("iid", "local"):
            q = make_queries(n, hq, d, dist, gen, dev, dtype)

            def select():
                sel = torch.empty(n, hkv, sc.selected_blocks, dtype=torch.int32, device=dev)
                cnt = torch.empty(n, hkv, dtype=torch.int32, device=dev)
                for s0 in range(0, n, SUB):
                    s1 = min(s0 + SUB, n)
                    nb = math.ceil((C + s1) / B)
                    a, c = select_paged(q[s0:s1], k1p, pt, slots[s0:s1], lens[s0:s1], sc, nb,
                                        one_sequence=True)
                    sel[s0:s1, :, :a.shape[-1]], cnt[s0:s1] = a, c
                return sel, cnt

            sel, cnt = select()

            def triton_attn(sel=sel, cnt=cnt):
                o = torch.empty_like(q)
                for s0 in range(0, n, SUB):
                    s1 = min(s0 + SUB, n)
                    paged_attention(q[s0:s1], kp, vp, pt, slots[s0:s1], lens[s0:s1], sel[s0:s1], cnt[s0:s1],
                                    0, num_splits=1, out=o[s0:s1])
                return o

            def triton_total():
                s, c = select()
                return triton_attn(s, c)

            paths = {}
            if "triton" in args.paths.split(","):
                paths["triton"] = dict(attn=triton_attn, total=triton_total, mask=None,
                                       blocks=float(cnt.float().mean()))
            for name, fold in (("flex", False), ("flex-fold", True)):
                if name not in args.paths.split(","):
                    continue
                def build(sel=sel, cnt=cnt, fold=fold):
                    return fs.build_inputs(sel, cnt, pt[0], C, n, P, hq, B, fold, pad_to=SUB)
                inp = build()

                def attn(inp=inp):
                    return fs.sparse_attention(flex, q, kp, vp, inp, fs.kernel_options(B))

                def masked(build=build):
                    return fs.sparse_attention(flex, q, kp, vp, build(), fs.kernel_options(B))

                def total(fold=fold):
                    s, c = select()
                    i = fs.build_inputs(s, c, pt[0], C, n, P, hq, B, fold, pad_to=SUB)
                    return fs.sparse_attention(flex, q, kp, vp, i, fs.kernel_options(B))
                def layout(fold=fold, rows=inp.rows):     # the q/o copies inside attn
                    q4 = fs.fold_queries(q, rows, hkv, fold).contiguous()
                    return fs.unfold_output(torch.empty_like(q4), n, hq, fold).contiguous()
                bm = inp.block_mask
                hw = bm.kv_num_blocks.shape[1]
                blocks = float((bm.kv_num_blocks + bm.full_kv_num_blocks).float().mean())
                paths[name] = dict(attn=attn, total=total, mask=masked, blocks=blocks, heads=hw, layout=layout)

            # correctness on a subset of rows
            g = torch.Generator().manual_seed(C)
            rows = torch.cat([torch.arange(32), n - 32 + torch.arange(32),
                              32 + torch.randperm(n - 64, generator=g)[:32]]).to(dev)
            ref = ref_attention(q[rows], kp, vp, pt, slots[rows], lens[rows], sel[rows], cnt[rows], 0).float()
            triton_full = None
            for name, p in list(paths.items()):
                t1 = time.perf_counter()
                try:                  # a flex compile error must not hide the other paths' numbers
                    full_out = p["attn"]().float()
                    out = full_out[rows]
                    err = float((out - ref).norm() / ref.norm())
                    if name == "triton":
                        triton_full = full_out
                    elif triton_full is not None:     # all rows against the (checked) triton output
                        err = max(err, float((full_out - triton_full).norm() / triton_full.norm()))
                except Exception as e:  # noqa: BLE001
                    print(f"FAIL ctx {C + n} {dist} {name}: {type(e).__name__}: {str(e).splitlines()[0][:300]}",
                          flush=True)
                    err = float("nan")
                p["err"] = err
                ok = err <= (1e-4 if args.smoke else 1e-2) and math.isfinite(err)
                print(f"{'ok  ' if ok else 'FAIL'} ctx {C + n} {dist} {name}: rel err {err:.2e} "
                      f"(first call {time.perf_counter() - t1:.1f} s; at {time.perf_counter() - t0:.0f} s)",
                      flush=True)
                if not ok:
                    bad.append((C + n, dist, name, err))
                    del paths[name]
            for name, p in paths.items():
                row = {"ctx": C + n, "dist": dist, "path": name, "blocks_per_tile": p["blocks"], "rel_err": p["err"]}
                row["attn_ms"] = measure(p["attn"], dev)
                row["mask_ms"] = measure(p["mask"], dev) if p["mask"] else None
                row["layout_ms"] = measure(p["layout"], dev) if "layout" in p else 0.0
                row["total_ms"] = measure(p["total"], dev)
                res["rows"].append(row)
                print(json.dumps({k: (round(v, 3) if isinstance(v, float) else v) for k, v in row.items()}),
                      flush=True)
            del paths
            if dev == "cuda":
                torch.cuda.empty_cache()

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    res["failed"] = bad
    tmp = out / "sparse_prefill_bench.json.tmp"
    tmp.write_text(json.dumps(res, indent=1, default=str))
    tmp.rename(out / "sparse_prefill_bench.json")
    print(f"\nsparse prefill attention, one layer, {n} query tokens, {hq}q/{hkv}kv heads, d{d}, "
          f"{str(dtype)[6:]}{' (SMOKE: CPU, tiny shapes, times meaningless)' if args.smoke else ''}; "
          f"total {time.perf_counter() - t0:.0f} s; checks {'FAILED ' + str(bad) if bad else 'ok'}")
    print("| ctx | queries | path | attn ms | +mask ms | total ms (+selection) | layout ms (in attn) "
          "| blocks/tile | rel err |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in res["rows"]:
        mask = f"{r['mask_ms']:.2f}" if r["mask_ms"] is not None else "-"
        print(f"| {r['ctx'] / 1024:g}K | {r['dist']} | {r['path']} | {r['attn_ms']:.2f} | {mask} | "
              f"{r['total_ms']:.2f} | {r['layout_ms']:.2f} | {r['blocks_per_tile']:.0f} | {r['rel_err']:.1e} |")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())

"""Skinny bf16 GEMM (runtime/ops/gemv/skinny.py) vs cuBLAS (F.linear) at decode batch sizes, on
the engine's bf16 projection shapes (sala-9b), one GPU.

    python benchmarks/skinny_gemm_bench.py [--out FILE.json] [--m 8,16,32,64] [--shapes 0,1,2,3,4]
    python benchmarks/skinny_gemm_bench.py --fold [--m 8,16,32] [--out FILE.json]

--fold: o_proj 4096x4096 with its gate folded in (gemv/skinny_fold.py, "norm_gate" and "gate")
against the separate gate kernel + the plain skinny GEMM (SKINNY_CONFIGS), every fold candidate
checked first (gate bit-exact, norm_gate <= 1e-2) then timed the same way; a table and the
FOLD_SKINNY_CONFIGS entries (best config per BM where the fold beats the separate pair) last (< 2 min).

Every candidate config is checked against an fp32 matmul first (rel err <= 1e-2, exit 1 on a
failure). Timing: each call in a CUDA graph whose calls rotate over > 200 MB of weight copies (no
L2 reuse), median of replays. GB/s = weight bytes / time. Last: a table and the SKINNY_CONFIGS
entries (the best config where it beats cuBLAS by >= 3%) to paste into skinny.py.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from w4a16_bench import copy_bandwidth, graph_time_us  # noqa: E402

# (N, K, what): the bf16 engine's fused decode projections
SHAPES = ((4096, 4096, "o_proj"), (8704, 4096, "sparse q/k/v/o_gate"), (16384, 4096, "lightning q/k/v/z"),
          (32768, 4096, "gate+up"), (4096, 16384, "down"))


def fold_main(ms: list[int], out: str | None, n: int = 4096, k: int = 4096, device: str = "cuda",
              dtype: torch.dtype = torch.bfloat16) -> int:
    from salactl.runtime.ops.fused import triton as fused
    from salactl.runtime.ops.gemv import skinny
    from salactl.runtime.ops.gemv import skinny_fold as SF
    from salactl.runtime.ops.gemv.check import check_skinny_fold, skinny_fold_inputs

    ceil = copy_bandwidth()
    print(f"copy ceiling {ceil:.0f} GB/s", flush=True)
    g = torch.Generator(device=device).manual_seed(0)
    copies = min(64, max(2, math.ceil(200e6 / (n * k * 2))))     # > 200 MB: no L2 reuse
    ws = [torch.randn(n, k, device=device, generator=g).to(dtype) for _ in range(copies)]
    rows, bad, per_key = [], [], {}
    for m in ms:
        for kind in SF.KINDS:
            checks = check_skinny_fold(device, dtype, [(m, n, k, kind)], configs=SF.CANDIDATE_CONFIGS)
            bad += [r for r in checks if not r[1] <= r[2]]
            failed = {r[0].split(".")[-2] for r in checks if not r[1] <= r[2]}
            a = skinny_fold_inputs(kind, m, n, k, device, dtype, seed=m)
            o, x2, gamma, eps = a["o"], a["x2"], a.get("gamma"), a.get("eps", 0.0)
            plain = skinny.SKINNY_CONFIGS.get((n, k, skinny.block_m(m)))
            if kind == "gate":
                def sep(w, c=plain):
                    return skinny.skinny_linear(fused.sigmoid_gate(o, x2), w, c)
            else:
                def sep(w, c=plain):
                    return skinny.skinny_linear(fused.rmsnorm_gate(o, gamma, x2, eps, w.dtype), w, c)
            t_sep = graph_time_us([lambda w=w: sep(w) for w in ws])
            res = {cfg: graph_time_us([lambda w=w, c=cfg: SF.skinny_fold_linear(kind, w, o, x2, gamma, eps=eps, config=c)
                                       for w in ws])
                   for cfg in SF.CANDIDATE_CONFIGS if str(cfg) not in failed}
            if not res:
                continue
            cfg, t = min(res.items(), key=lambda kv: kv[1])
            committed = SF.FOLD_SKINNY_CONFIGS.get((n, k, skinny.block_m(m), kind))
            rows.append(dict(m=m, kind=kind, separate_us=t_sep, fold_us=t, config=cfg,
                             committed_us=res.get(committed), saved_us=t_sep - t,
                             pct_copy=100 * n * k * 2 / (t * 1e-6) / 1e9 / ceil,
                             all_us={str(c): round(v, 2) for c, v in res.items()}))
            per_key.setdefault((n, k, skinny.block_m(m), kind), []).append((t_sep, res))
            print(json.dumps(rows[-1]), flush=True)
    if out:
        Path(out).write_text(json.dumps(dict(ceil_gb_s=ceil, rows=rows, failed=[str(b) for b in bad]), indent=1))
    print("\n| M | fold | separate kernel + skinny us | folded us (best config) | committed config us | saved us | % of copy |"
          "\n|---|---|---|---|---|---|---|")
    for r in rows:
        cu = f"{r['committed_us']:.2f}" if r["committed_us"] is not None else "-"
        print(f"| {r['m']} | {r['kind']} | {r['separate_us']:.2f} | {r['fold_us']:.2f} {r['config']} | {cu} | "
              f"{r['saved_us']:.2f} | {r['pct_copy']:.0f}% |")
    best = {}
    for key, runs in sorted(per_key.items()):       # M 8 and 16 share BM 16: least total time
        common = set.intersection(*(set(res) for _, res in runs))
        if common:
            cfg = min(common, key=lambda c: sum(res[c] for _, res in runs))
            if all(res[cfg] < ts for ts, res in runs):
                best[key] = cfg
    print("\nFOLD_SKINNY_CONFIGS = {" + ", ".join(f"{key}: {cfg}" for key, cfg in best.items()) + "}")
    for b in bad:
        print("FAILED check", b)
    return 1 if bad else 0


def main() -> int:
    from salactl.runtime.ops.gemv import skinny

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=None)
    ap.add_argument("--m", default=None, help="rows (default 8,16,32,64; with --fold 8,16,32)")
    ap.add_argument("--shapes", default="0,1,2,3,4", help="indices into SHAPES")
    ap.add_argument("--fold", action="store_true", help="o_proj with its gate folded in vs separate")
    args = ap.parse_args()
    if args.fold:
        return fold_main([int(v) for v in (args.m or "8,16,32").split(",")], args.out)
    ms = [int(v) for v in (args.m or "8,16,32,64").split(",")]
    ceil = copy_bandwidth()
    print(f"copy ceiling {ceil:.0f} GB/s", flush=True)
    g = torch.Generator(device="cuda").manual_seed(0)
    rows, bad, per_bm = [], [], {}
    for n, k, what in (SHAPES[int(i)] for i in args.shapes.split(",")):
        copies = max(2, math.ceil(200e6 / (n * k * 2)))
        ws = [torch.randn(n, k, device="cuda", generator=g).bfloat16() for _ in range(copies)]
        for m in ms:
            x = torch.randn(m, k, device="cuda", generator=g).bfloat16()
            ref = x.float() @ ws[0].float().t()
            t_cublas = graph_time_us([lambda w=w: torch.nn.functional.linear(x, w) for w in ws])
            res = {}
            for cfg in skinny.CANDIDATE_CONFIGS:
                err = float((skinny.skinny_linear(x, ws[0], cfg).float() - ref).norm() / ref.norm())
                if not err <= 1e-2:
                    bad.append((n, k, m, cfg, err))
                    continue
                res[cfg] = graph_time_us([lambda w=w, c=cfg: skinny.skinny_linear(x, w, c) for w in ws])
            cfg, t = min(res.items(), key=lambda kv: kv[1])
            gbs = n * k * 2 / (t * 1e-6) / 1e9
            rows.append(dict(shape=f"{n}x{k}", what=what, m=m, cublas_us=t_cublas, skinny_us=t, config=cfg,
                             speedup=t_cublas / t, gb_s=gbs, pct_copy=100 * gbs / ceil,
                             all_us={str(c): round(v, 2) for c, v in res.items()}))
            per_bm.setdefault((n, k, skinny.block_m(m)), []).append((t_cublas, res))
            print(json.dumps(rows[-1]), flush=True)
        del ws
        torch.cuda.empty_cache()
    if args.out:
        Path(args.out).write_text(json.dumps(dict(ceil_gb_s=ceil, rows=rows, failed=[str(b) for b in bad]), indent=1))
    print("\n| shape | M | cuBLAS us | skinny us (best config) | speedup | % of copy |\n|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['shape']} {r['what']} | {r['m']} | {r['cublas_us']:.2f} | {r['skinny_us']:.2f} {r['config']} | "
              f"{r['speedup']:.2f}x | {r['pct_copy']:.0f}% |")
    # several M share one BM (8 and 16 -> 16): the config with the least total time over them,
    # kept only if it beats cuBLAS by >= 3% at every such M
    best = {}
    for key, runs in sorted(per_bm.items()):
        common = set.intersection(*(set(res) for _, res in runs))
        if common:
            cfg = min(common, key=lambda c: sum(res[c] for _, res in runs))
            if all(tc / res[cfg] >= 1.03 for tc, res in runs):
                best[key] = cfg
    print("\nSKINNY_CONFIGS = {" + ", ".join(f"{key}: {cfg}" for key, cfg in best.items()) + "}")
    for b in bad:
        print("FAILED check", b)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())

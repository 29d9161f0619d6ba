"""Folded batch-1 GEMVs (runtime/ops/gemv/fused.py) on one GPU: correctness, isolated timings and
the whole sala-9b batch-1 4K decode step with and without the folds, in one run (< 60 s).

    python benchmarks/gemv_fold_bench.py [--out DIR] [--budget-s 45]

1. correctness: every (shape, kind, block shape) that is timed, against the plain-PyTorch
   reference (separate op then an fp32-accumulated linear) on random bf16 inputs; any failure
   stops the run (exit 1).
2. step (runs first: the number that matters): `sala-9b` random bf16 weights, GPUEngine at
   batch 1 with a synthetic 4K context; the decode step's CUDA-graph replay (median of 40) with
   the folds off, with FOLD_CONFIGS as committed, and leaving out one fold group at a time; the
   logits of each variant vs the folds-off step for the same state (bf16 ≤ 3e-2).
3. isolated (until --budget-s is spent): per decode projection, the separate kernel (add+RMSNorm / o_norm·sigmoid /
   o·sigmoid / silu·mul; for lm_head also the /logit_divisor and .float() kernels) + cuBLAS, the
   separate kernel + our plain GEMV, and the folded GEMV per candidate block shape; CUDA graph
   over > 256 MB of weight copies (no L2 reuse), median of replays.
Results: OUT/gemv_fold_bench.json; the table is printed last.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import gpu_engine_bench as G  # noqa: E402
from timing import events_time, graph_time  # noqa: E402

from salactl.runtime.ops.fused import triton as fused  # noqa: E402
from salactl.runtime.ops.gemv import fused as fold  # noqa: E402
from salactl.runtime.ops.gemv import triton as gv  # noqa: E402
from salactl.runtime.ops.gemv.check import check_fold_gemv, fold_inputs  # noqa: E402

T0 = time.perf_counter()
# name -> (N, K, kind, calls per sala-9b decode step)
# (isolated sweeps run in this order until the time budget is spent)
PROJECTIONS = {"gate_up": (32768, 4096, "norm", 32), "qkvz (lightning)": (16384, 4096, "norm", 24),
               "down": (4096, 16384, "glu", 32), "o_proj (lightning)": (4096, 4096, "norm_gate", 24),
               "qkvg (sparse)": (8704, 4096, "norm", 8), "o_proj (sparse)": (4096, 4096, "gate", 8),
               "lm_head": (73448, 4096, "norm", 1)}
GROUPS = {"norm->qkv,gate_up": [(16384, 4096, "norm"), (8704, 4096, "norm"), (32768, 4096, "norm")],
          "norm->lm_head": [(73448, 4096, "norm")], "o_norm*sig->o_proj": [(4096, 4096, "norm_gate")],
          "o*sig->o_proj": [(4096, 4096, "gate")], "silu*mul->down": [(4096, 16384, "glu")]}
# Every program re-reads the fold's inputs (h, δ, γ / o, z / gate, up) from L2: fewer, taller
# programs (larger BN) cut that traffic, too few leave SMs idle. Each new config: ~1 s of JIT.
WIDE = ((16, 512, 8, 3), (32, 256, 8, 3), (64, 128, 8, 3))   # sweep for N >= 8704
NARROW = ((4, 1024, 4, 4), (8, 512, 4, 4), (16, 512, 8, 3))  # sweep for N = 4096
RESULTS: dict = {}


def elapsed() -> float:
    return time.perf_counter() - T0


def sweep_configs(n, k, kind):
    cfgs = [fold.FOLD_CONFIGS.get((n, k, kind))] + list(WIDE if n >= 8704 else NARROW)
    return list(dict.fromkeys(c for c in cfgs if c))


def correctness():
    shapes = [(n, k, kind) for n, k, kind, _ in PROJECTIONS.values()]
    rows = []
    for n, k, kind in shapes:
        rows += check_fold_gemv("cuda", torch.bfloat16, [(n, k, kind)], configs=sweep_configs(n, k, kind))
    bad = [r for r in rows if not r[1] <= r[2]]
    worst = max(rows, key=lambda r: r[1] / r[2])
    RESULTS["correctness"] = {"checked": len(rows), "failed": bad, "worst": worst}
    print(f"== correctness: {len(rows)} checks, worst {worst[0]} {worst[1]:.2e} (tol {worst[2]:.0e})", flush=True)
    if bad:
        for r in bad:
            print(f"   FAIL {r[0]} {r[1]:.3e} (tol {r[2]:.0e})")
        raise SystemExit(1)


def _separate(kind, a, lm_head):
    """The op the fold replaces, as the fused model runs it today (one or more kernels)."""
    if kind == "norm":
        x = fused.add_rmsnorm(a["x"], a["x2"], a["scale"], a["gamma"], a["eps"])[1]
        return x / 16.0 if lm_head else x
    if kind == "norm_gate":
        return fused.rmsnorm_gate(a["x"], a["gamma"], a["x2"], a["eps"], torch.bfloat16)
    if kind == "glu":
        return fused.silu_mul(a["x"])
    return fused.sigmoid_gate(a["x"], a["x2"])


def isolated(budget_s):
    out = {}
    for name, (n, k, kind, calls) in PROJECTIONS.items():
        if elapsed() > budget_s:
            out[name] = {"skipped": "time budget"}
            continue
        lm = name == "lm_head"
        copies = max(2, math.ceil((256 << 20) / (n * k * 2)))
        a = fold_inputs(kind, n, k, "cuda", torch.bfloat16)
        ws = [a.pop("w")] + [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02 for _ in range(copies - 1)]

        def timed(fn):
            st = {"i": 0}

            def call():
                fn(ws[st["i"] % copies])
                st["i"] += 1
            return graph_time(call, inner=copies * 2, reps=10) * 1e6

        def post(y):
            return y.float() if lm else y
        plain_cfg = gv.GEMV_CONFIGS.get((n, k), gv.DEFAULT_CONFIG)
        row = {"calls_per_step": calls,
               "sep_cublas_us": timed(lambda w: post(F.linear(_separate(kind, a, lm), w))),
               "sep_gemv_us": timed(lambda w: post(gv.gemv(_separate(kind, a, lm), w, plain_cfg))),
               "fused_us": {}}
        kw = dict(scale=a.get("scale", 1.0), eps=a.get("eps", 0.0))
        if lm:
            kw.update(out_scale=1 / 16, out_dtype=torch.float32)
        for cfg in sweep_configs(n, k, kind):
            row["fused_us"][str(cfg)] = timed(lambda w, c=cfg: fold.fold_gemv(
                kind, w, a["x"], a.get("x2"), a.get("gamma"), config=c, **kw))
        best = min(row["fused_us"], key=row["fused_us"].get)
        unfused = min(row["sep_cublas_us"], row["sep_gemv_us"])
        row.update(best=best, best_us=row["fused_us"][best], unfused_us=unfused,
                   gb_s=n * k * 2 / row["fused_us"][best] / 1e3,
                   step_saving_us=(unfused - row["fused_us"][best]) * calls,
                   committed=str(fold.FOLD_CONFIGS.get((n, k, kind))))
        out[name] = row
        print(f"   {name}: {json.dumps(row)}", flush=True)
        ws.clear()
        torch.cuda.empty_cache()
    RESULTS["isolated"] = out
    return out


def best_table(iso) -> dict:
    """FOLD_CONFIGS from the isolated sweep: the fastest block shape, only where folding wins
    (shapes not swept keep their committed entry)."""
    table = {}
    for name, (n, k, kind, _) in PROJECTIONS.items():
        r = iso.get(name, {})
        if "best_us" in r and r["best_us"] < r["unfused_us"]:
            table[(n, k, kind)] = tuple(int(v) for v in r["best"].strip("()").split(","))
        elif "best_us" not in r and (n, k, kind) in fold.FOLD_CONFIGS:
            table[(n, k, kind)] = fold.FOLD_CONFIGS[(n, k, kind)]
    return table


def step(ceil):
    from salactl.runtime.gpu.engine import GPUEngine
    from salactl.runtime.loader import load_model

    model = load_model("sala-9b", "cuda", "bf16", random_weights=True, seed=0).model
    engine = GPUEngine(model, "cuda", max_running_requests=1, chunk_size=4096, max_context=8192)
    engine.pools.k.normal_()
    engine.pools.v.normal_()
    engine.pools.state.normal_(std=0.01)
    syn = G.Synthetic(engine, 1, 4096)
    r = engine.runner
    floor = G.decode_bytes(engine.config, model, 1, 4096) / (ceil * 1e12)
    state0 = engine.pools.state.clone()
    committed = dict(fold.FOLD_CONFIGS)
    variants = {"off": None, "committed": committed}
    for g, keys in GROUPS.items():
        if any(key in committed for key in keys):
            variants[f"without {g}"] = {key: c for key, c in committed.items() if key not in keys}
    out = RESULTS["step"] = {"floor_ms": floor * 1e3}      # filled as variants finish
    ref = None
    try:
        for name, table in variants.items():
            model.fold_into_gemv = table is not None
            fold.FOLD_CONFIGS.clear()
            fold.FOLD_CONFIGS.update(table or {})
            r.graphs.clear()
            r._pool = None
            engine.pools.state.copy_(state0)
            logits = r.decode(syn.rows(0))            # captures this variant's graph, then replays it
            ref = logits if ref is None else ref
            err = float((logits.double() - ref.double()).norm() / ref.double().norm())
            graph, _ = r.graphs[(1, False)]
            t = events_time(graph.replay, reps=40, warm=5)
            out[name] = {"replay_ms": t * 1e3, "tok_s": 1 / t, "pct_of_floor": 100 * floor / t,
                         "logits_rel_err_vs_off": err, "folds": len(table or {})}
            print(f"   step {name}: {json.dumps(out[name])}", flush=True)
            if err > 3e-2:
                RESULTS.setdefault("failures", []).append(f"step {name}: logits rel err {err:.3e} vs folds off > 3e-2")
                print(f"   FAIL {RESULTS['failures'][-1]}", flush=True)
    finally:
        fold.FOLD_CONFIGS.clear()
        fold.FOLD_CONFIGS.update(committed)
        syn.close()
    del engine, model
    gc.collect()
    torch.cuda.empty_cache()
    return out


def copy_ceiling() -> float:
    n = 1 << 30
    a = torch.empty(n, dtype=torch.uint8, device="cuda").random_()
    b = torch.empty_like(a)
    t = events_time(lambda: b.copy_(a), reps=10)
    return 2 * n / t / 1e12


def table():
    lines = ["", f"copy ceiling {RESULTS.get('copy_tb_s', 0):.2f} TB/s; "
             f"correctness {RESULTS.get('correctness', {}).get('checked', 0)} checks ok; total {elapsed():.0f} s", "",
             "| projection (N x K, fold) | sep+cuBLAS us | sep+GEMV us | fused best us (config) | fused committed us | GB/s | x/step | step saving us |",
             "|---|---|---|---|---|---|---|---|"]
    for name, (n, k, kind, calls) in PROJECTIONS.items():
        r = RESULTS.get("isolated", {}).get(name, {})
        if "best_us" not in r:
            lines.append(f"| {name} {n}x{k} {kind} | {r.get('skipped', 'not run')} | | | | | | |")
            continue
        com = r["fused_us"].get(r["committed"])
        com = f"{com:.1f}" if com is not None else "-"
        lines.append(f"| {name} {n}x{k} {kind} | {r['sep_cublas_us']:.1f} | {r['sep_gemv_us']:.1f} | "
                     f"{r['best_us']:.1f} {r['best']} | {com} | {r['gb_s']:.0f} | {calls} | "
                     f"{r['step_saving_us']:+.0f} |")
    s = RESULTS.get("step", {})
    if "isolated" in RESULTS:
        best = best_table(RESULTS["isolated"])
        lines += ["", "FOLD_CONFIGS from the isolated sweep (winners only): {" +
                  ", ".join(f"{k}: {v}" for k, v in best.items()) + "}"]
    if "off" in s:
        lines += ["", f"sala-9b decode b1 4K, CUDA-graph replay (floor {s['floor_ms']:.2f} ms):", "",
                  "| variant | folds | ms | tok/s | % of floor | logits rel err vs off |", "|---|---|---|---|---|---|"]
        for name, v in s.items():
            if isinstance(v, dict) and "replay_ms" in v:
                bad = " FAIL" if v["logits_rel_err_vs_off"] > 3e-2 else ""
                lines.append(f"| {name} | {v['folds']} | {v['replay_ms']:.3f} | {v['tok_s']:.1f} | "
                             f"{v['pct_of_floor']:.1f} | {v['logits_rel_err_vs_off']:.1e}{bad} |")
    if "step_error" in RESULTS:
        lines.append(f"step: ERROR {RESULTS['step_error'][:200]}")
    if RESULTS.get("failures"):
        lines += ["", "FAILED: " + "; ".join(RESULTS["failures"])]
    print("\n".join(lines))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=None)
    ap.add_argument("--budget-s", type=float, default=45.0,
                    help="start no further isolated sweep after this many seconds since start")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("gemv_fold_bench.py: needs a CUDA GPU")
    out = Path(args.out) if args.out else G.OUT
    RESULTS["copy_tb_s"] = copy_ceiling()
    torch.cuda.empty_cache()
    correctness()
    try:
        step(RESULTS["copy_tb_s"])
    except SystemExit:
        raise
    except Exception as e:                       # keep going: the isolated numbers still come
        import traceback
        traceback.print_exc()
        RESULTS["step_error"] = f"{type(e).__name__}: {e}"
    isolated(args.budget_s)
    out.mkdir(parents=True, exist_ok=True)
    (out / "gemv_fold_bench.json").write_text(json.dumps(RESULTS, indent=1, default=str))
    table()
    if RESULTS.get("failures"):
        raise SystemExit(1)


if __name__ == "__main__":
    main()

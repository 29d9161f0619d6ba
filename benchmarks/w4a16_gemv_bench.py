"""The batch-1 W4A16 CUDA-core GEMV (runtime/ops/w4a16/gemv.py) against bf16 cuBLAS and the
tensor-core dispatch (`w4a16_linear`) on the 9B shapes at one row. One GPU; table last.

    python benchmarks/w4a16_gemv_bench.py [--shapes 0,2,3,4,5 (the engine's fused shapes)] [--out DIR]

Every GemvConfig in SWEEP is first checked against the fp32 dequant-matmul (rel err <= 1e-2; a
failing config is reported and makes the exit status non-zero), then timed. Method as in
w4a16_bench.py (whose helpers this reuses): random codes, scales and activations; each timed call
in a CUDA graph whose calls rotate over > 200 MB of weight copies; median of replays; GB/s on
the packed bytes (int4 + fp16 scales) and % of the copy ceiling measured first.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from w4a16_bench import GROUP, ROTATE_BYTES, SHAPES, copy_bandwidth, graph_time_us, make_shape, rel_err  # noqa: E402

from salactl.runtime.ops.w4a16.gemv import GemvConfig, w4a16_gemv  # noqa: E402
from salactl.runtime.ops.w4a16.triton import w4a16_linear  # noqa: E402

SWEEP = [GemvConfig(rows=r, kblocks=kb, split_k=sp, num_warps=4, prefetch=pf)
         for r in (16, 32, 64) for kb in (4, 8) for sp in (1, 2, 4) for pf in (False, True) if not (pf and r == 64)]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default="0,2,3,4,5")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    out = Path(args.out or os.environ.get("OUT", "out"))
    gen = torch.Generator(device="cuda").manual_seed(0)
    ceil = copy_bandwidth()
    print(f"copy ceiling {ceil:.0f} GB/s", flush=True)
    results, failures = [], []
    for si in (int(v) for v in args.shapes.split(",")):
        name, N, K = SHAPES[si]
        d = make_shape(N, K, gen)
        qt, s, w_ref = d["q"], d["s"], d["w_ref"]
        packed = qt.numel() * 4 + s.numel() * 2
        copies = [(qt.clone(), s.clone()) for _ in range(max(1, math.ceil(ROTATE_BYTES / packed)))]
        wb = [w_ref.bfloat16() for _ in range(max(1, math.ceil(ROTATE_BYTES / (N * K * 2))))]
        x = torch.randn(1, K, device="cuda", generator=gen).bfloat16()
        ref = x.float() @ w_ref.t()
        row = {"shape": name, "N": N, "K": K, "packed_mb": packed / 2 ** 20,
               "bf16_us": graph_time_us([lambda w=w: torch.nn.functional.linear(x, w) for w in wb]),
               "tc_us": graph_time_us([lambda c=c: w4a16_linear(x, c[0], c[1], GROUP) for c in copies]),
               "tc_err": rel_err(w4a16_linear(x, qt, s, GROUP), ref), "configs": {}}
        for cfg in SWEEP:
            try:
                err = rel_err(w4a16_gemv(x, qt, s, GROUP, cfg), ref)
                if not err <= 1e-2:
                    failures.append(f"{name} {cfg.name}: rel err {err:.2e}")
                    continue
                us = graph_time_us([lambda c=c, cfg=cfg: w4a16_gemv(x, c[0], c[1], GROUP, cfg) for c in copies])
                row["configs"][cfg.name] = {"us": us, "err": err}
            except Exception as ex:
                failures.append(f"{name} {cfg.name}: {type(ex).__name__}: {str(ex)[:120]}")
        best = min(row["configs"].items(), key=lambda kv: kv[1]["us"], default=None)
        if best:
            row["best"], row["best_us"] = best[0], best[1]["us"]
        results.append(row)
        top = sorted(row["configs"].items(), key=lambda kv: kv[1]["us"])[:5]
        print(f"{name} {N}x{K}: bf16 {row['bf16_us']:.2f} tc {row['tc_us']:.2f} | "
              + ", ".join(f"{k} {v['us']:.2f}" for k, v in top), flush=True)
    out.mkdir(parents=True, exist_ok=True)
    (out / "w4a16_gemv_bench.json").write_text(json.dumps({"ceiling_gb_s": ceil, "rows": results,
                                                           "failures": failures}, indent=1))
    print("\n| shape | N x K | bf16 µs | TC dispatch µs (x bf16) | best GEMV µs (x bf16) | GB/s (% copy) | best config |")
    print("|---|---|---|---|---|---|---|")
    for r in results:
        if "best_us" not in r:
            continue
        gbs = r["packed_mb"] * 2 ** 20 / r["best_us"] / 1e3
        print(f"| {r['shape']} | {r['N']}x{r['K']} | {r['bf16_us']:.2f} | {r['tc_us']:.2f} ({r['bf16_us'] / r['tc_us']:.2f}x) | "
              f"{r['best_us']:.2f} ({r['bf16_us'] / r['best_us']:.2f}x) | {gbs:.0f} ({100 * gbs / ceil:.0f}%) | {r['best']} |")
    for f in failures:
        print("FAILED", f)
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()

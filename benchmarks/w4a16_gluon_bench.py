"""Check the Gluon mma.sync W4A16 kernel (runtime/ops/w4a16/gluon_mma.py) against the fp32
dequant-matmul reference, then time its configs against bf16 cuBLAS and the runtime dispatch
(w4a16_bench.py's method: rotating CUDA graphs over > 200 MB of weight copies, medians). Table last.

    python benchmarks/w4a16_gluon_bench.py [--shapes 0,2,3,4,5] [--batches 1,8] [--configs "R,W,U,bias;..."]
"""

from __future__ import annotations

import argparse
import math
import sys

import torch

from salactl.runtime.ops.pdl import enabled as pdl_enabled
from salactl.runtime.ops.w4a16.gluon_mma import w4a16_mma
from salactl.runtime.ops.w4a16.layout import pack_tc
from salactl.runtime.ops.w4a16.triton import w4a16_linear
from timing import graph_time_us
from w4a16_bench import GROUP, MAX_ERR, ROTATE_BYTES, SHAPES, make_shape, n_calls, parse_shape, rel_err

# R slabs of 16 rows, W warps, U blocks per warp and step, bias MMA, register prefetch depth (0-2),
# fence after each step's word loads (0 none, 2 CTA barrier)
DEFAULT_CONFIGS = ("1,8,4,1,0,0;1,8,4,1,0,2;1,8,1,1,1,2;1,8,1,1,2,2;1,8,2,1,1,2;2,8,1,1,1,2;2,8,1,1,2,2;"
                   "1,4,2,1,1,2;2,4,1,1,2,2;4,4,1,1,1,2;1,4,4,1,0,2;2,8,2,1,0,2")


def parse(text: str) -> list[tuple]:
    return [tuple(int(v) for v in spec.split(",")) for spec in filter(None, text.split(";"))]


def run(x, q, s, group, c, pdl=False):
    r, w, u, b, pf, fence = c
    return w4a16_mma(x, q, s, group, R=r, W=w, U=u, bias_mma=bool(b), pf=pf, fence=fence, pdl=pdl)


def name(c) -> str:
    return "R{}W{}U{}b{}pf{}f{}".format(*c)


def check_edges(configs, gen) -> list[str]:
    """Odd shapes: a slab count not a multiple of R, M = 3 / 8, one group over K, fp16 activations."""
    bad = []
    for N, K, M, group, dtype in ((256, 4096, 3, GROUP, torch.bfloat16), (272, 1024, 8, -1, torch.bfloat16),
                                  (4096 + 16 * 3, 1152, 1, GROUP, torch.float16), (48, 384, 5, GROUP, torch.float16)):
        q = torch.randint(0, 16, (K, N), device="cuda", generator=gen, dtype=torch.int32)
        gs = K if group == -1 else group
        s = (torch.rand(K // gs, N, device="cuda", generator=gen) * 2e-3 + 1e-3).half()
        w = ((q.float() - 8) * s.float().repeat_interleave(gs, 0)).t()
        x = torch.randn(M, K, device="cuda", generator=gen).to(dtype)
        ref = x.float() @ w.t()
        for c in configs:
            e = rel_err(run(x, pack_tc(q), s, group, c), ref)
            if e > MAX_ERR:
                bad.append(f"N={N} K={K} M={M} group={group} {dtype} {name(c)}: rel err {e:.3g}")
    return bad


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default="0,2,3,4,5")
    ap.add_argument("--batches", default="1,8")
    ap.add_argument("--configs", default=DEFAULT_CONFIGS)
    args = ap.parse_args()
    torch.manual_seed(0)
    gen = torch.Generator(device="cuda").manual_seed(0)
    configs = parse(args.configs)
    pdl = pdl_enabled(torch.device("cuda"))
    bad = check_edges(configs, gen)
    for b in bad:
        print("WRONG", b, flush=True)
    rows = []
    for spec in args.shapes.split(","):
        sname, N, K = SHAPES[int(spec)] if spec.isdigit() else parse_shape(spec)
        d = make_shape(N, K, gen)
        qt, s, w_ref = d["q"], d["s"], d["w_ref"]
        packed = qt.numel() * 4 + s.numel() * 2
        ncopy = max(1, math.ceil(ROTATE_BYTES / packed))
        tcs = [(qt.clone(), s.clone()) for _ in range(ncopy)]
        w_bf16 = w_ref.bfloat16()
        for M in (int(v) for v in args.batches.split(",")):
            x = torch.randn(M, K, device="cuda", generator=gen).bfloat16()
            ref = x.float() @ w_ref.t()
            calls = n_calls(N * K * 2, M)
            bw = [w_bf16.clone() for _ in range(min(calls, max(1, math.ceil(ROTATE_BYTES / (N * K * 2)))))]
            t_bf16 = graph_time_us([lambda i=i: torch.nn.functional.linear(x, bw[i % len(bw)]) for i in range(calls)])
            bw.clear()
            calls = n_calls(packed, M)
            t_disp = graph_time_us([lambda i=i: w4a16_linear(x, *tcs[i % ncopy], GROUP) for i in range(calls)])
            res = {}
            for cfg in configs:
                e = rel_err(run(x, qt, s, GROUP, cfg, pdl), ref)
                if e > MAX_ERR:
                    bad.append(f"{sname} M={M} {name(cfg)}: rel err {e:.3g}")
                    print("WRONG", bad[-1], flush=True)
                    continue
                res[cfg] = graph_time_us([lambda i=i, c=cfg: run(x, *tcs[i % ncopy], GROUP, c, pdl)
                                          for i in range(calls)], replays=5)
            best = min(res.items(), key=lambda kv: kv[1]) if res else (None, float("nan"))
            rows.append((sname, N, K, M, t_bf16, t_disp, best, res))
            print(f"{sname} M={M}: bf16 {t_bf16:.2f} dispatch {t_disp:.2f} ({t_bf16 / t_disp:.2f}x) gluon best "
                  f"{best[1]:.2f} ({t_bf16 / best[1]:.2f}x) {best[0]}  | " +
                  " ".join(f"{name(c)}={t:.2f}" for c, t in res.items()), flush=True)
        tcs.clear()
    print("\n| shape | M | bf16 us | dispatch us (x) | gluon best us (x) | config |")
    print("|---|---|---|---|---|---|")
    for sname, N, K, M, tb, td, (cfg, tg), _ in rows:
        print(f"| {sname} {N}x{K} | {M} | {tb:.2f} | {td:.2f} ({tb / td:.2f}x) | {tg:.2f} ({tb / tg:.2f}x) | "
              f"{name(cfg)} |" if cfg else f"| {sname} | {M} | - | - | - | none |")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())

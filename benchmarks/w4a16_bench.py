"""Check our Triton W4A16 kernels against the fp32 dequant-matmul reference and time them against
bf16 cuBLAS on the MiniCPM-SALA 9B linear shapes (issue 5). One GPU, < 3 minutes; table last.

    PYTHONPATH=. python benchmarks/w4a16_bench.py [--out DIR] [--no-sweep | --quick]
        [--shapes 0,1,2,3] [--batches 1,8,32,4096] [--configs "bn=64,w=4,bias=1,un=1,pf=0,waves=4;..."]

"ours" is the runtime dispatch (`triton.py` `w4a16_linear` over the `pack_tc` layout: the
register-operand tensor-core kernel `triton_tc.py` below 512 rows, dequantize + cuBLAS above).
For M <= 64 every candidate tensor-core config (BLOCK_N x warps, bias-MMA vs fma dequant,
unroll 2/4, register prefetch or cp.async stages, split-K for 2/4/8 waves of CTAs, or `--configs`,
where `split=N` fixes the split instead of `waves`) is checked and timed too.

Method (the device README's METHOD.md): random codes, scales and activations (never zeros); every
timed call sits in a CUDA graph whose calls rotate over > 200 MB of weight copies (no L2 reuse);
median of replays; the copy-bandwidth ceiling is measured first. Packed bytes = int4 + fp16 scales.
Error = ||y - ref|| / ||ref|| with ref = x.float() @ W_fp32ᵀ.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys

import torch

from salactl.runtime.ops.w4a16.layout import pack_tc
from salactl.runtime.ops.w4a16.triton import DEQUANT_MIN_ROWS, sm_count, w4a16_linear
from salactl.runtime.ops.w4a16.triton_tc import TCConfig, default_tc_config, tc_block_m, w4a16_tc

SHAPES = [("qkv/o/z", 4096, 4096), ("k/v (sparse)", 256, 4096), ("gate/up", 16384, 4096),
          ("down", 4096, 16384)]
LM_HEAD = ("lm_head (bf16 only)", 73448, 4096)
GROUP = 128
ROTATE_BYTES = 200 << 20
MAX_ERR = 1e-2


def copy_bandwidth() -> float:
    a = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    b = torch.empty_like(a)
    for _ in range(3):
        b.copy_(a)
    torch.cuda.synchronize()
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    e0.record()
    for _ in range(10):
        b.copy_(a)
    e1.record()
    torch.cuda.synchronize()
    return 2 * a.numel() * 10 / (e0.elapsed_time(e1) / 1e3) / 1e9


def graph_time_us(calls: list, replays: int = 7) -> float:
    """Median time per call (µs) of `calls` captured back to back in one CUDA graph."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):
            for c in calls:
                c()
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for c in calls:
            c()
    g.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(replays):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        g.replay()
        e1.record()
        torch.cuda.synchronize()
        times.append(e0.elapsed_time(e1) * 1e3 / len(calls))
    del g
    return statistics.median(times)


def n_calls(bytes_per_call: int, m: int) -> int:
    copies = max(1, math.ceil(ROTATE_BYTES / bytes_per_call))
    return max(copies, 8 if m >= 1024 else 64)


def parse_configs(text: str) -> list:
    """'bn=64,w=4,bias=1,un=1,waves=4;...' -> [grid spec, ...] (`split=N` overrides waves)."""
    out = []
    for item in filter(None, (t.strip() for t in text.split(";"))):
        kv = dict(p.split("=") for p in item.split(","))
        out.append((int(kv.get("bn", 64)), int(kv.get("w", 4)), bool(int(kv.get("bias", 1))),
                    int(kv.get("un", 1)), bool(int(kv.get("pf", 0))), float(kv.get("waves", 4)),
                    int(kv.get("stages", 1)), int(kv.get("split", 0))))
    return out


# (block_n, warps, bias-mma, unroll, prefetch, waves, num_stages, fixed split or 0)
# modes: (unroll, register prefetch, num_stages); num_stages > 1 lets Triton pipeline the words and
# activations through shared memory with cp.async
_FMA_MODES = ((1, False, 1), (2, False, 1), (4, False, 1), (1, True, 1), (1, False, 3), (1, False, 4))
_BIAS_MODES = ((1, False, 1), (1, True, 1), (1, False, 3))
_KERNELS = [(bn, w, bias, un, pf, st) for bn, w in ((64, 4), (128, 8))
            for bias, modes in ((False, _FMA_MODES), (True, _BIAS_MODES)) for un, pf, st in modes]
DEFAULT_GRID = [(bn, w, bias, un, pf, waves, st, 0) for bn, w, bias, un, pf, st in _KERNELS for waves in (2, 4, 8)]
QUICK_GRID = [(bn, w, bias, un, pf, 4, st, 0) for bn, w, bias, un, pf, st in _KERNELS]


def tc_config(spec, M: int, N: int, K: int, sms: int) -> TCConfig:
    bn, w, bias, un, pf, waves, stages, fixed = spec
    bm = tc_block_m(M)
    tiles = math.ceil(N / bn) * math.ceil(M / bm)
    split = max(1, min(K // 128, fixed or round(waves * sms / tiles)))
    return TCConfig(bn, bm, split, w, stages, bias, un, pf)


def label(cfg: TCConfig) -> str:
    return (f"tc bn{cfg.block_n} w{cfg.num_warps} {'bias-mma' if cfg.bias_dot else 'fma'} un{cfg.unroll}"
            f"{' pf' if cfg.prefetch else ''} st{cfg.num_stages} split{cfg.split_k}")


def spec_label(spec) -> str:
    bn, w, bias, un, pf, waves, stages, fixed = spec
    return (f"bn{bn} w{w} {'bias-mma' if bias else 'fma'} un{un}{' pf' if pf else ''} st{stages} "
            + (f"split{fixed}" if fixed else f"waves{waves:g}"))


def rel_err(y: torch.Tensor, ref: torch.Tensor) -> float:
    if not bool(torch.isfinite(y).all()):
        return float("inf")
    return float((y.float() - ref).norm() / ref.norm())


def bench_shape(name: str, N: int, K: int, batches, gen, sms: int, grid: list, log) -> list[dict]:
    rows = []
    q = torch.randint(0, 16, (K, N), device="cuda", generator=gen, dtype=torch.int32)
    s = (torch.rand(K // GROUP, N, device="cuda", generator=gen) * 2e-3 + 1e-3).half()
    w_ref = ((q.float() - 8) * s.float().repeat_interleave(GROUP, 0)).t().contiguous()      # [N, K] fp32
    w_bf16 = w_ref.bfloat16()
    qt = pack_tc(q)
    packed_bytes = qt.numel() * 4 + s.numel() * 2
    ncopy = max(1, math.ceil(ROTATE_BYTES / packed_bytes))
    tcs = [(qt.clone(), s.clone()) for _ in range(ncopy)]
    for M in batches:
        x = torch.randn(M, K, device="cuda", generator=gen).bfloat16()
        ref = x.float() @ w_ref.t()
        calls = n_calls(N * K * 2, M)
        bw = [w_bf16.clone() for _ in range(min(calls, max(1, math.ceil(ROTATE_BYTES / (N * K * 2)))))]
        t_bf16 = graph_time_us([lambda i=i: torch.nn.functional.linear(x, bw[i % len(bw)]) for i in range(calls)])
        bw.clear()
        calls = n_calls(packed_bytes, M)
        err = rel_err(w4a16_linear(x, qt, s, GROUP), ref)
        t_ours = graph_time_us([lambda i=i: w4a16_linear(x, *tcs[i % ncopy], GROUP) for i in range(calls)])
        dflt = ("dequant+cuBLAS" if M >= DEQUANT_MIN_ROWS else label(default_tc_config(M, N, K, sms)))
        row = {"shape": name, "N": N, "K": K, "M": M, "bf16_us": t_bf16, "ours_us": t_ours, "rel_err": err,
               "default_cfg": dflt, "packed_GBps": packed_bytes / (t_ours * 1e-6) / 1e9, "variants": {}}
        best = (t_ours, dflt, err)
        if M <= 64:
            done: dict = {}
            for spec in grid:
                cfg = tc_config(spec, M, N, K, sms)
                key = spec_label(spec)
                if cfg in done:                      # another waves value gave the same split
                    row["variants"][key] = done[cfg]
                    continue
                try:
                    e = rel_err(w4a16_tc(x, qt, s, GROUP, cfg), ref)
                    if e > MAX_ERR:
                        log(f"  {name} M={M} {key}: WRONG rel err {e:.3g}")
                        row["variants"][key] = {"err": e}
                        continue
                    t = graph_time_us([lambda i=i, c=cfg: w4a16_tc(x, *tcs[i % ncopy], GROUP, c)
                                       for i in range(calls)], replays=5)
                except Exception as ex:      # a config that fails to compile/launch is reported, not fatal
                    log(f"  {name} M={M} {key}: failed {type(ex).__name__}: {str(ex)[:300]}")
                    continue
                row["variants"][key] = done[cfg] = {"us": t, "err": e, "split": cfg.split_k}
                best = min(best, (t, label(cfg), e))
        row["best_us"], row["best_cfg"], row["best_err"] = best
        rows.append(row)
        log(f"{name} M={M}: bf16 {t_bf16:.2f} us, ours {t_ours:.2f} us ({t_bf16 / t_ours:.2f}x, err {err:.1e}), "
            f"best {best[0]:.2f} us ({t_bf16 / best[0]:.2f}x) {best[1]}")
    tcs.clear()
    return rows


def print_tables(rows: list[dict], ceiling: float, t_lm: float) -> None:
    print(f"\ncopy ceiling {ceiling:.0f} GB/s; lm_head 73448x4096 stays bf16: {t_lm:.1f} us at M=1")
    hdr = (f"{'shape':13} {'N x K':>11} {'M':>5} {'bf16 us':>8} {'ours us':>8} {'x':>5} {'best us':>8} {'x':>5} "
           f"{'GB/s':>5} {'%ceil':>5} {'err':>7}")
    print(hdr)
    for r in rows:
        b = r["best_us"]
        line = (f"{r['shape']:13} {str(r['N']) + 'x' + str(r['K']):>11} {r['M']:>5} {r['bf16_us']:8.2f} "
                f"{r['ours_us']:8.2f} {r['bf16_us'] / r['ours_us']:5.2f} {b:8.2f} {r['bf16_us'] / b:5.2f} "
                f"{r['packed_GBps']:5.0f} {100 * r['packed_GBps'] / ceiling:5.1f} {r['rel_err']:7.1e}")
        print(line)
    for r in rows:
        print(f"default {r['shape']} M={r['M']}: {r['default_cfg']} | best: {r['best_cfg']} (err {r['best_err']:.1e})")
    # speedup of every variant on every (shape, M): what the dispatch defaults are picked from
    cols = [r for r in rows if r["variants"]]
    if cols:
        print("\nvariant speedup over bf16; columns: " + ", ".join(f"{r['shape'].split()[0]}/M{r['M']}" for r in cols))
        for k in sorted({k for r in cols for k in r["variants"]}):
            cells = []
            for r in cols:
                v = r["variants"].get(k)
                cells.append(f"{r['bf16_us'] / v['us']:5.2f}" if v and "us" in v else "    -")
            print(f"{k:44} " + " ".join(cells))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--no-sweep", action="store_true", help="time only the dispatch")
    ap.add_argument("--shapes", default="all", help="comma list of shape indexes (0-3) or 'all'")
    ap.add_argument("--batches", default="1,8,32,4096", help="comma list of M values")
    ap.add_argument("--quick", action="store_true", help="an 18-config grid (waves 4 only) instead of 54")
    ap.add_argument("--configs", default="", help="tensor-core configs to sweep instead of the default grid: "
                    "'bn=64,w=4,bias=1,un=1,pf=0,waves=4,stages=1[,split=8];...'")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("needs a CUDA GPU")
    os.makedirs(args.out, exist_ok=True)         # before the measurements, not after them
    torch.backends.cuda.matmul.allow_tf32 = False
    gen = torch.Generator(device="cuda").manual_seed(0)
    sms = sm_count(torch.device("cuda"))
    log = lambda m: print(m, file=sys.stderr, flush=True)  # noqa: E731
    ceiling = copy_bandwidth()
    import triton
    log(f"{torch.cuda.get_device_name()} | {sms} SMs | copy ceiling {ceiling:.0f} GB/s | torch {torch.__version__} "
        f"| triton {triton.__version__}")
    grid = [] if args.no_sweep else (parse_configs(args.configs) if args.configs
                                     else QUICK_GRID if args.quick else DEFAULT_GRID)
    batches = [int(m) for m in args.batches.split(",")]
    shapes = SHAPES if args.shapes == "all" else [SHAPES[int(i)] for i in args.shapes.split(",")]
    rows = []
    for name, N, K in shapes:
        rows += bench_shape(name, N, K, batches, gen, sms, grid, log)
    _, N, K = LM_HEAD
    w = torch.randn(N, K, device="cuda", generator=gen).bfloat16()
    x = torch.randn(1, K, device="cuda", generator=gen).bfloat16()
    t_lm = graph_time_us([lambda: torch.nn.functional.linear(x, w)] * 16)
    out = os.path.join(args.out, "w4a16_bench.json")
    with open(out + ".tmp", "w") as f:
        json.dump({"device": torch.cuda.get_device_name(), "copy_GBps": ceiling, "rows": rows,
                   "lm_head_bf16_M1_us": t_lm}, f, indent=1)
    os.replace(out + ".tmp", out)
    print_tables(rows, ceiling, t_lm)
    bad = [r for r in rows if r["rel_err"] > MAX_ERR]
    if bad:
        sys.exit(f"{len(bad)} rows over the {MAX_ERR} error bound")


if __name__ == "__main__":
    main()

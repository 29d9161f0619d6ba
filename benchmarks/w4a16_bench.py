"""Check our Triton W4A16 kernel against the plain reference and time it against bf16 cuBLAS on the
MiniCPM-SALA 9B linear shapes (issue 5). One GPU; prints a short table last.

    PYTHONPATH=. python benchmarks/w4a16_bench.py [--out DIR] [--no-sweep]

Method (the device README's METHOD.md): random inputs (never zeros); every timed call in a CUDA
graph whose calls rotate over enough weight copies (> 3x the L2) that nothing is served from cache;
median of replays; copy-bandwidth ceiling measured first. Packed bytes = int4 weights + fp16 scales.
For M <= 32 it also sweeps a few kernel/tile/split configurations and reports the best beside the
default (the dispatcher's choice).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys

import torch

from salactl.runtime.ops.w4a16.layout import pack_interleaved
from salactl.runtime.ops.w4a16.triton import (DEQUANT_MIN_ROWS, GEMV_MAX_ROWS, MMConfig, _sm_count,
                                              default_config, w4a16_dequantize, w4a16_linear, w4a16_mm)
from salactl.runtime.ops.w4a16.triton_gemv import w4a16_gemv

SHAPES = [("qkv/o/z", 4096, 4096), ("k/v (sparse)", 256, 4096), ("gate/up", 16384, 4096),
          ("down", 4096, 16384)]
LM_HEAD = ("lm_head (bf16 only)", 73448, 4096)
MS = (1, 8, 32, 4096)
GROUP = 128
ROTATE_BYTES = 200 << 20


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


def weights(N: int, K: int, gen):
    q = torch.randint(0, 16, (K, N), device="cuda", generator=gen, dtype=torch.int32)
    s = (torch.rand(K // GROUP, N, device="cuda", generator=gen) * 2e-3 + 1e-3).half()
    w_ref = ((q.float() - 8) * s.float().repeat_interleave(GROUP, 0)).t().contiguous()     # [N, K]
    return pack_interleaved(q), s, w_ref


def check(qw, s, w_ref, M: int, K: int, gen, cfg=None) -> float:
    x = torch.randn(M, K, device="cuda", generator=gen).bfloat16()
    y = run_config(cfg, x, qw, s) if cfg is not None else w4a16_linear(x, qw, s, GROUP)
    ref = x.float() @ w_ref.t()
    if not bool(torch.isfinite(y).all()):
        return float("inf")
    return float((y.float() - ref).norm() / ref.norm())


def sweep_configs(M: int, N: int, K: int, sms: int) -> list:
    """Candidates: ("gemv", block_n, split, warps, stages, unroll) for the CUDA-core GEMV (M = 1) and MMConfig
    for the tensor-core kernel (M <= 32); prefill is dequant + cuBLAS (it beat every Triton GEMM
    tile in the first sweep)."""
    if M >= 256:
        return []
    out: list = []
    if M == 1:
        for bn in (128, 256):
            for t in (2, 4):
                split = max(1, min(K // 128, math.ceil(t * sms / math.ceil(N / bn))))
                out += [("gemv", bn, split, 4, st, un) for st in (1, 3) for un in (1, 2)]
    bm = 16 if M <= 16 else 32
    if M > 1:
        for bn, fused in ((128, False), (64, True)):
            tiles = math.ceil(M / bm) * math.ceil(N / bn)
            for t in (2, 4):
                out.append(MMConfig(bm, bn, max(1, min(K // 128, math.ceil(t * sms / tiles))), fused, 8, 4, 3))
    return list(dict.fromkeys(out))


def run_config(cfg, x, qw, s):
    if isinstance(cfg, tuple):
        _, bn, split, warps, stages, unroll = cfg
        return w4a16_gemv(x, qw, s, GROUP, block_n=bn, split_k=split, num_warps=warps, num_stages=stages,
                          unroll=unroll)
    return w4a16_mm(x, qw, s, GROUP, cfg)


def bench_shape(label: str, N: int, K: int, gen, sms: int, sweep: bool, log) -> list[dict]:
    rows = []
    qw, s, w_ref = weights(N, K, gen)
    w_bf16 = w_ref.bfloat16()
    packed_bytes = qw.numel() * 4 + s.numel() * 2
    for M in MS:
        x = torch.randn(M, K, device="cuda", generator=gen).bfloat16()
        err = check(qw, s, w_ref, M, K, gen)
        calls = n_calls(N * K * 2, M)
        bw = [w_bf16.clone() for _ in range(min(calls, max(1, math.ceil(ROTATE_BYTES / (N * K * 2)))))]
        t_bf16 = graph_time_us([lambda i=i: torch.nn.functional.linear(x, bw[i % len(bw)]) for i in range(calls)])
        del bw
        ncopy = max(1, math.ceil(ROTATE_BYTES / packed_bytes))
        qs = [(qw.clone(), s.clone()) for _ in range(ncopy)]
        calls = n_calls(packed_bytes, M)
        t_ours = graph_time_us([lambda i=i: w4a16_linear(x, *qs[i % ncopy], GROUP) for i in range(calls)])
        row = {"shape": label, "N": N, "K": K, "M": M, "bf16_us": t_bf16, "ours_us": t_ours, "rel_err": err,
               "default_cfg": ("dequant+cuBLAS" if M >= DEQUANT_MIN_ROWS else "gemv" if M <= GEMV_MAX_ROWS
                               else str(default_config(M, N, K, sms))),
               "packed_GBps": packed_bytes / (t_ours * 1e-6) / 1e9}
        if sweep:
            best = (t_ours, row["default_cfg"])
            cands = sweep_configs(M, N, K, sms)
            if M >= DEQUANT_MIN_ROWS:
                t = graph_time_us([lambda i=i: x @ w4a16_dequantize(*qs[i % ncopy], GROUP, x.dtype)
                                   for i in range(calls)])
                row["dequant_cublas_us"] = t
                best = min(best, (t, "dequant+cuBLAS"))
            for cfg in cands:
                try:
                    e = check(qw, s, w_ref, M, K, gen, cfg)
                    if e > 2e-2:
                        log(f"  config {cfg} WRONG rel err {e:.3g}")
                        continue
                    t = graph_time_us([lambda i=i, c=cfg: run_config(c, x, *qs[i % ncopy])
                                       for i in range(calls)], replays=5)
                    log(f"  {cfg}: {t:.2f} us")
                except Exception as ex:      # a config that fails to compile/launch is skipped
                    log(f"  config {cfg} failed: {type(ex).__name__}: {str(ex)[:200]}")
                    continue
                best = min(best, (t, str(cfg)))
            row["best_us"], row["best_cfg"] = best
        del qs
        rows.append(row)
        log(json.dumps(row))
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--no-sweep", action="store_true")
    ap.add_argument("--shapes", default="all", help="comma list of shape indexes (0-3) or 'all'")
    ap.add_argument("--batches", default="1,8,32,4096", help="comma list of M values")
    args = ap.parse_args()
    global MS
    MS = tuple(int(m) for m in args.batches.split(","))
    if not torch.cuda.is_available():
        sys.exit("needs a CUDA GPU")
    torch.backends.cuda.matmul.allow_tf32 = False
    gen = torch.Generator(device="cuda").manual_seed(0)
    sms = _sm_count(torch.device("cuda"))
    log = lambda m: print(m, file=sys.stderr, flush=True)  # noqa: E731
    ceiling = copy_bandwidth()
    log(f"{torch.cuda.get_device_name()} | {sms} SMs | copy ceiling {ceiling:.0f} GB/s | torch {torch.__version__}")
    shapes = SHAPES if args.shapes == "all" else [SHAPES[int(i)] for i in args.shapes.split(",")]
    rows = []
    for label, N, K in shapes:
        rows += bench_shape(label, N, K, gen, sms, not args.no_sweep, log)
    _, N, K = LM_HEAD
    w = torch.randn(N, K, device="cuda", generator=gen).bfloat16()
    x = torch.randn(1, K, device="cuda", generator=gen).bfloat16()
    t_lm = graph_time_us([lambda: torch.nn.functional.linear(x, w)] * 16)
    with open(os.path.join(args.out, "w4a16_bench.json"), "w") as f:
        json.dump({"device": torch.cuda.get_device_name(), "copy_GBps": ceiling, "rows": rows,
                   "lm_head_bf16_M1_us": t_lm}, f, indent=1)
    print(f"\ncopy ceiling {ceiling:.0f} GB/s; lm_head 73448x4096 stays bf16: {t_lm:.1f} us at M=1")
    hdr = (f"{'shape':14} {'N x K':>12} {'M':>5} {'bf16 us':>9} {'ours us':>9} {'x':>6} {'best us':>9} {'x':>6} "
           f"{'GB/s':>6} {'%ceil':>6} {'err':>8}")
    print(hdr)
    for r in rows:
        best = r.get("best_us", r["ours_us"])
        print(f"{r['shape']:14} {str(r['N']) + 'x' + str(r['K']):>12} {r['M']:>5} {r['bf16_us']:9.2f} "
              f"{r['ours_us']:9.2f} {r['bf16_us'] / r['ours_us']:6.2f} {best:9.2f} {r['bf16_us'] / best:6.2f} "
              f"{r['packed_GBps']:6.0f} {100 * r['packed_GBps'] / ceiling:6.1f} {r['rel_err']:8.1e}")
    for r in rows:
        if "best_cfg" in r:
            print(f"best {r['shape']} M={r['M']}: {r['best_cfg']}")


if __name__ == "__main__":
    main()

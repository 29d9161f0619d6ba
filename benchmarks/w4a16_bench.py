"""Check our Triton W4A16 kernels against the fp32 dequant-matmul reference and time them against
bf16 cuBLAS on the MiniCPM-SALA 9B linear shapes. One GPU; table last.

    python benchmarks/w4a16_bench.py --fast --out DIR          # <= 60 s incl. JIT: shapes 0,2,3,4,5,
                                                               # M 1/8/32, FAST_GRID (10 configs)
    python benchmarks/w4a16_bench.py --tma --out DIR           # the TMA variants (TMA_GRID) at M 1/8
    python benchmarks/w4a16_bench.py [--out DIR] [--no-sweep | --quick | --fast]
        [--shapes 0,1,2,3|NxK,...] [--batches 1,8,32,4096] [--configs "bn=64,w=4,bias=0,un=2,pf=1,waves=4,red=4;..."]
        [--read-floor]
    python benchmarks/w4a16_bench.py --glu [--batches 1,8,32]   # gate+up then silu_mul vs the GLU epilogue

"ours" is the runtime dispatch (`triton.py` `w4a16_linear` over the `pack_tc` layout: the
register-operand tensor-core kernel `triton_tc.py` below 512 rows, dequantize + cuBLAS above;
its configs come from `TC_DEFAULTS` / `TC_SHAPE_DEFAULTS` in `tc_config.py`, in the spec syntax below).
For M <= 64 every candidate config spec (`tc_config.parse_tc_spec`: BLOCK_N x warps, bias-MMA vs
fma dequant, unroll, register software pipeline pf, cp.async stages, split-K by waves of CTAs or
a fixed `split=S`, chunked split-K sums red) is first checked against the reference (a wrong or
failing variant is listed at the end and makes the exit status non-zero), then timed. Every
distinct kernel is JIT-compiled first in parallel processes (Triton's disk cache).

Output (stdout): the speedup of every variant on every (shape, M); per (shape, M) the dispatch's
config and the best spec (paste it into TC_SHAPE_DEFAULTS / TC_DEFAULTS); last the summary table:
bf16 cuBLAS µs, ours (dispatch) µs and speedup, best variant µs and speedup, GB/s and % of the
copy ceiling on the packed bytes for the dispatch and for the best variant, dispatch rel err; with
--glu only the engine's gate+up (32768x4096, [gate | up]) as the dispatch GEMM then the silu_mul kernel
against `w4a16_glu` (silu(gate)·up in the GEMM's epilogue), checked equal first; with
--read-floor a last table: per shape the read floor (read_floor.py: the fastest kernel that only
reads the packed bytes once) and bf16 / read floor, the most any W4A16 kernel could reach there.

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
import sys

import torch

from salactl.runtime.ops.w4a16.layout import pack_tc
from salactl.runtime.ops.device_props import sm_count
from salactl.runtime.ops.w4a16.triton import DEQUANT_MIN_ROWS, w4a16_linear
from salactl.runtime.ops.w4a16.tc_config import TCConfig, default_tc_config, parse_tc_spec, tc_config_from_spec
from salactl.runtime.ops.w4a16.triton_tc import w4a16_tc
from read_floor import read_floor_us
from timing import graph_time_us

# 0-3: the 9B's separate projections; 4-5: what the engine runs since it fuses projections along N
# (q/k/v/z of a lightning layer = 16384x4096 like gate/up; sparse q/k/v/o_gate 8704x4096; gate+up)
SHAPES = [("o/q 4096", 4096, 4096), ("k/v (sparse)", 256, 4096), ("qkvz|gate/up", 16384, 4096),
          ("down", 4096, 16384), ("sparse qkvog", 8704, 4096), ("gate+up", 32768, 4096)]
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


def n_calls(bytes_per_call: int, m: int) -> int:
    copies = max(1, math.ceil(ROTATE_BYTES / bytes_per_call))
    return max(copies, 8 if m >= 1024 else 64)


def parse_shape(text: str) -> tuple[str, int, int]:
    """'3' -> SHAPES[3]; '16384x2048' -> an N x K shape of its own (K % 128 == 0, N % 16 == 0)."""
    if "x" not in text:
        return SHAPES[int(text)]
    N, K = (int(v) for v in text.split("x"))
    if K % 128 or N % 16:
        sys.exit(f"shape {text}: the W4A16 kernel needs K % 128 == 0 and N % 16 == 0")
    return (text, N, K)


def parse_configs(text: str) -> list[str]:
    """'bn=64,w=4,un=4,pf=1,waves=4;...' -> spec strings (tc_config.parse_tc_spec checks every field)."""
    specs = [t.strip() for t in text.split(";") if t.strip()]
    for spec in specs:
        parse_tc_spec(spec)
    return specs


# modes: (unroll, register prefetch, num_stages); num_stages > 1 lets Triton pipeline the words and
# activations through shared memory with cp.async
_FMA_MODES = ((1, 0, 1), (2, 0, 1), (4, 0, 1), (1, 1, 1), (1, 0, 3), (1, 0, 4))
_BIAS_MODES = ((1, 0, 1), (1, 1, 1), (1, 0, 3))
_KERNELS = [f"bn={bn},w={w},bias={bias},un={un},pf={pf},stages={st}" for bn, w in ((64, 4), (128, 8))
            for bias, modes in ((0, _FMA_MODES), (1, _BIAS_MODES)) for un, pf, st in modes]
DEFAULT_GRID = [f"{k},waves={waves}" for k in _KERNELS for waves in (2, 4, 8)]
QUICK_GRID = [f"{k},waves=4" for k in _KERNELS]
# --fast: the dispatch defaults (the baselines) and the latency/memory-parallelism knobs: register
# software pipeline (pf=1 with un=2/4), chunked split-K sums (red), more or fewer splits (waves),
# 128-row tiles, split rounded down (fit). 10 configs x 2 BLOCK_M, compiled in parallel first.
# Registers / SASS per weight in the loop: offline sm_90 compile (triton 3.9) at BLOCK_M 16.
FAST_GRID = [
    "bn=64,w=4,bias=0,un=4,pf=0,stages=1,waves=4,red=1",     # TC_DEFAULTS[16] at 59939ab (2.6 SASS/weight)
    "bn=64,w=4,bias=0,un=1,pf=0,stages=3,waves=4,red=1",     # TC_DEFAULTS[32] at 59939ab
    "bn=64,w=4,bias=0,un=4,pf=0,stages=1,waves=4,red=4",
    "bn=64,w=4,bias=0,un=4,pf=0,stages=1,waves=8,red=8",
    "bn=64,w=4,bias=0,un=1,pf=0,stages=3,waves=4,red=4",
    "bn=64,w=4,bias=0,un=2,pf=1,stages=1,waves=4,red=4",     # 128 regs: 4 CTAs/SM
    "bn=64,w=4,bias=0,un=2,pf=1,stages=1,waves=8,red=8",
    "bn=64,w=4,bias=0,un=4,pf=1,stages=1,waves=2,red=4",     # 231 regs: 2 CTAs/SM
    "bn=128,w=4,bias=0,un=1,pf=1,stages=1,waves=3,fit=1,red=4",  # 168 regs: 3 CTAs/SM, 2.2 SASS/weight
    "bn=128,w=8,bias=0,un=2,pf=1,stages=1,waves=2,red=4",    # 127 regs x 256 threads: 2 CTAs/SM
]
# --tma: the Hopper TMA loop (triton_tma.py: words and scales by TMA, tma=2 activations too, in a
# `stages`-deep mbarrier pipeline) next to the BLOCK_M 16 default, at M 1/8. Offline sm_90 compile
# (triton 3.9, M=1): registers, shared memory per CTA, SASS per 64 weights in the loop (default: 164).
TMA_GRID = [
    "bn=64,w=4,bias=0,un=4,pf=0,stages=1,waves=4,red=1",     # TC_DEFAULTS[16] (122 regs, 16 KB, 164)
    "bn=64,w=4,tma=1,stages=4,waves=4",                      # 71 regs, 29 KB, 229
    "bn=64,w=4,tma=2,stages=4,waves=4",                      # 71 regs, 29 KB, 236
    "bn=64,w=4,tma=2,stages=6,waves=2",                      # 71 regs, 46 KB, 235
    "bn=64,w=4,tma=2,stages=3,waves=8,red=4",                # 71 regs, 21 KB, 236
    "bn=128,w=4,tma=1,stages=4,waves=2",                     # 128 regs, 42 KB, 177
    "bn=128,w=4,tma=2,stages=4,waves=2",                     # 128 regs, 42 KB, 178
    "bn=128,w=4,tma=2,stages=6,waves=1",                     # 128 regs, 67 KB, 178
    "bn=128,w=4,tma=2,stages=3,waves=4,red=4",               # 128 regs, 29 KB, 178
    "bn=128,w=8,tma=2,stages=4,waves=2",                     # 79 regs, 42 KB, 235
    "bn=64,w=4,tma=1,tkb=2,stages=3,waves=4",                # 95 regs, 42 KB, 192 (two blocks per copy)
    "bn=64,w=4,tma=2,tkb=2,stages=3,waves=2",                # 80 regs, 42 KB, 208
    "bn=128,w=4,tma=1,tkb=2,stages=3,waves=2",               # 168 regs, 58 KB, 154
    "bn=128,w=4,tma=1,tkb=2,stages=2,waves=1",               # 167 regs, 33 KB, 152
]
FAST_SHAPES = "0,2,3,4,5"
FAST_BATCHES = "1,8,32"


def label(cfg: TCConfig) -> str:
    return (f"tc bn{cfg.block_n} w{cfg.num_warps} {'bias-mma' if cfg.bias_dot else 'fma'} un{cfg.unroll}"
            f"{f' pf{int(cfg.prefetch)}' if cfg.prefetch else ''}"
            f"{f' tma{cfg.tma} tkb{cfg.tma_blocks}' if cfg.tma else ''} st{cfg.num_stages} split{cfg.split_k} "
            f"red{cfg.reduce}")


def _compile_worker(cfgs: list) -> list[str]:
    """Compile (into Triton's on-disk cache) each TCConfig with a small call of the same
    specialisation (N, K, strides multiples of 16; M > 1 and split_k > 1: M = 1 and split 1 are
    specialised by Triton and compile on first use)."""
    torch.cuda.init()
    failures = []
    for cfg in cfgs:
        try:
            x = torch.randn(1, 256, device="cuda").bfloat16()
            q = pack_tc(torch.randint(0, 16, (256, 256), dtype=torch.int32)).cuda()
            s = torch.ones(2, 256, device="cuda").half()
            w4a16_tc(x, q, s, GROUP, cfg)
        except Exception as ex:      # reported by the main process when it runs the config
            failures.append(f"{label(cfg)}: {type(ex).__name__}")
    torch.cuda.synchronize()
    return failures


def precompile(cfgs: list, log) -> None:
    """JIT every distinct kernel in parallel processes first (the sweep is JIT-bound otherwise)."""
    import concurrent.futures as cf
    import multiprocessing as mp

    uniq = list(dict.fromkeys(cfgs))
    workers = max(1, min(len(uniq), (os.cpu_count() or 2) - 1, 12))
    chunks = [uniq[i::workers] for i in range(workers)]
    with cf.ProcessPoolExecutor(workers, mp_context=mp.get_context("spawn")) as ex:
        for fails in ex.map(_compile_worker, chunks):
            for f in fails:
                log(f"  precompile failed: {f}")
    log(f"precompiled {len(uniq)} kernels in {workers} processes")


def rel_err(y: torch.Tensor, ref: torch.Tensor) -> float:
    if not bool(torch.isfinite(y).all()):
        return float("inf")
    return float((y.float() - ref).norm() / ref.norm())


def make_shape(N: int, K: int, gen) -> dict:
    q = torch.randint(0, 16, (K, N), device="cuda", generator=gen, dtype=torch.int32)
    s = (torch.rand(K // GROUP, N, device="cuda", generator=gen) * 2e-3 + 1e-3).half()
    w_ref = ((q.float() - 8) * s.float().repeat_interleave(GROUP, 0)).t().contiguous()      # [N, K] fp32
    return {"q": pack_tc(q), "s": s, "w_ref": w_ref}


def bench_shape(name: str, N: int, K: int, batches, gen, sms: int, grid: list, log,
                read_floor: bool = False) -> list[dict]:
    rows = []
    d = make_shape(N, K, gen)
    qt, s, w_ref = d["q"], d["s"], d["w_ref"]
    w_bf16 = w_ref.bfloat16()
    packed_bytes = qt.numel() * 4 + s.numel() * 2
    ncopy = max(1, math.ceil(ROTATE_BYTES / packed_bytes))
    tcs = [(qt.clone(), s.clone()) for _ in range(ncopy)]
    for M in batches:
        x = torch.randn(M, K, device="cuda", generator=gen).bfloat16()
        ref = x.float() @ w_ref.t()
        dflt = ("dequant+cuBLAS" if M >= DEQUANT_MIN_ROWS else label(default_tc_config(M, N, K, sms)))
        row = {"shape": name, "N": N, "K": K, "M": M, "default_cfg": dflt, "variants": {}, "wrong": []}
        # correctness of the dispatch and of every variant before anything is timed
        row["rel_err"] = err = rel_err(w4a16_linear(x, qt, s, GROUP), ref)
        if err > MAX_ERR:
            row["wrong"].append(f"dispatch {dflt}: rel err {err:.3g}")
        checked: dict = {}
        for spec in (grid if M <= 64 else []):
            cfg = tc_config_from_spec(spec, M, N, K, sms)
            if cfg in checked:                       # another spec gave the same kernel and split
                row["variants"][spec] = {"same_as": checked[cfg]}
                continue
            try:
                for _ in range(2):                   # the second call checks the split-K counter reset
                    e = rel_err(w4a16_tc(x, qt, s, GROUP, cfg), ref)
                    if e > MAX_ERR:
                        break
            except Exception as ex:      # a config that fails to compile/launch is reported, not fatal
                row["wrong"].append(f"{spec}: failed {type(ex).__name__}: {str(ex)[:200]}")
                continue
            if e > MAX_ERR:
                row["wrong"].append(f"{spec} ({label(cfg)}): WRONG rel err {e:.3g}")
                continue
            checked[cfg] = spec
            row["variants"][spec] = {"err": e, "split": cfg.split_k, "cfg": label(cfg)}
        for w in row["wrong"]:
            log(f"  {name} M={M} {w}")
        calls = n_calls(N * K * 2, M)
        bw = [w_bf16.clone() for _ in range(min(calls, max(1, math.ceil(ROTATE_BYTES / (N * K * 2)))))]
        row["bf16_us"] = t_bf16 = graph_time_us(
            [lambda i=i: torch.nn.functional.linear(x, bw[i % len(bw)]) for i in range(calls)])
        bw.clear()
        calls = n_calls(packed_bytes, M)
        row["ours_us"] = t_ours = graph_time_us([lambda i=i: w4a16_linear(x, *tcs[i % ncopy], GROUP)
                                                 for i in range(calls)])
        row["packed_GBps"] = packed_bytes / (t_ours * 1e-6) / 1e9
        best = (t_ours, "dispatch: " + dflt, err)
        for spec, v in row["variants"].items():
            if "err" not in v:
                continue
            cfg = tc_config_from_spec(spec, M, N, K, sms)
            v["us"] = t = graph_time_us([lambda i=i, c=cfg: w4a16_tc(x, *tcs[i % ncopy], GROUP, c)
                                         for i in range(calls)], replays=5)
            best = min(best, (t, spec, v["err"]))
        for v in row["variants"].values():
            if "same_as" in v:
                v.update({k: row["variants"][v["same_as"]].get(k) for k in ("us", "err")})
        row["best_us"], row["best_cfg"], row["best_err"] = best
        if read_floor:
            row["read_us"], row["read_cfg"] = (rows[-1]["read_us"], rows[-1]["read_cfg"]) if rows else \
                read_floor_us(packed_bytes, ncopy, calls)
        rows.append(row)
        log(f"{name} M={M}: bf16 {t_bf16:.2f} us, ours {t_ours:.2f} us ({t_bf16 / t_ours:.2f}x, err {err:.1e}), "
            f"best {best[0]:.2f} us ({t_bf16 / best[0]:.2f}x) {best[1]}")
    tcs.clear()
    return rows


def bench_glu(batches, gen, log) -> list[dict]:
    """gate+up (32768x4096) then silu_mul against w4a16_glu at each M: us per call (same rotation)."""
    from salactl.runtime.ops.fused.triton import silu_mul
    from salactl.runtime.ops.w4a16.triton import w4a16_glu

    _, N, K = SHAPES[5]
    d = make_shape(N, K, gen)
    packed_bytes = d["q"].numel() * 4 + d["s"].numel() * 2
    ncopy = max(1, math.ceil(ROTATE_BYTES / packed_bytes))
    tcs = [(d["q"].clone(), d["s"].clone()) for _ in range(ncopy)]
    rows = []
    for M in batches:
        x = torch.randn(M, K, device="cuda", generator=gen).bfloat16()
        same = torch.equal(w4a16_glu(x, d["q"], d["s"], GROUP), silu_mul(w4a16_linear(x, d["q"], d["s"], GROUP)))
        calls = n_calls(packed_bytes, M)
        sep = graph_time_us([lambda i=i: silu_mul(w4a16_linear(x, *tcs[i % ncopy], GROUP)) for i in range(calls)])
        fused = graph_time_us([lambda i=i: w4a16_glu(x, *tcs[i % ncopy], GROUP) for i in range(calls)])
        rows.append({"M": M, "separate_us": sep, "glu_us": fused, "equal": same})
        log(f"gate+up + silu_mul M={M}: separate {sep:.2f} us, GLU epilogue {fused:.2f} us, equal {same}")
    print("\n| M | gate+up GEMM + silu_mul us | GLU epilogue us | separate / GLU | bit-equal |\n|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['M']} | {r['separate_us']:.2f} | {r['glu_us']:.2f} | {r['separate_us'] / r['glu_us']:.3f}x | "
              f"{r['equal']} |")
    return rows


def suggest_defaults(rows: list[dict]) -> None:
    """Paste-ready dispatch table lines: per (N, K, BLOCK_M) the spec with the least summed time over
    that BLOCK_M's batches, and per BLOCK_M the spec with the least summed (time / best time) over
    all shapes (specs timed everywhere only)."""
    from salactl.runtime.ops.w4a16.tc_config import tc_block_m

    groups: dict = {}
    for r in rows:
        if r["variants"]:
            groups.setdefault(tc_block_m(r["M"]), {}).setdefault((r["N"], r["K"]), []).append(r)
    if not groups:
        return
    print()
    for bm, shapes in groups.items():
        rel: dict = {}
        for (N, K), rs in shapes.items():
            tot: dict = {}
            for r in rs:
                for spec, v in r["variants"].items():
                    if v.get("us"):
                        tot.setdefault(spec, []).append(v["us"])
                        rel.setdefault(spec, []).append(v["us"] / r["best_us"])
            full = {k: sum(t) for k, t in tot.items() if len(t) == len(rs)}
            if full:
                spec = min(full, key=full.get)
                print(f'TC_SHAPE_DEFAULTS[({N}, {K}, {bm})] = "{spec}"   # {full[spec] / len(rs):.2f} us mean '
                      f'over M={",".join(str(r["M"]) for r in rs)}')
        n = max((len(v) for v in rel.values()), default=0)
        full = {k: sum(v) / n for k, v in rel.items() if len(v) == n}
        if full:
            spec = min(full, key=full.get)
            print(f'TC_DEFAULTS[{bm}] = "{spec}"   # mean time / best = {full[spec]:.3f}')


def print_tables(rows: list[dict], ceiling: float, t_lm: float) -> None:
    """Variant matrix, then the best spec per (shape, M), then the summary table (last)."""
    cols = [r for r in rows if r["variants"]]
    if cols:
        print("variant speedup over bf16 (- = wrong or failed); columns: "
              + ", ".join(f"{r['shape']}/M{r['M']}" for r in cols))
        for k in dict.fromkeys(k for r in cols for k in r["variants"]):
            cells = []
            for r in cols:
                v = r["variants"].get(k)
                cells.append(f"{r['bf16_us'] / v['us']:5.2f}" if v and v.get("us") else "    -")
            print(f"{k:52} " + " ".join(cells))
        print()
    for r in rows:
        print(f"M={r['M']:<4} {r['shape']:13} dispatch: {r['default_cfg']} | best: {r['best_cfg']} "
              f"({r['best_us']:.2f} us, err {r['best_err']:.1e})")
    suggest_defaults(rows)
    print(f"\ncopy ceiling {ceiling:.0f} GB/s; lm_head 73448x4096 stays bf16: {t_lm:.1f} us at M=1")
    print(f"{'shape':13} {'N x K':>11} {'M':>5} {'bf16 us':>8} {'ours us':>8} {'x':>5} {'best us':>8} {'x':>5} "
          f"{'GB/s':>5} {'%ceil':>5} {'bestGB':>6} {'%ceil':>5} {'err':>7}")
    for r in rows:
        b = r["best_us"]
        best_gbps = r["packed_GBps"] * r["ours_us"] / b
        print(f"{r['shape']:13} {str(r['N']) + 'x' + str(r['K']):>11} {r['M']:>5} {r['bf16_us']:8.2f} "
              f"{r['ours_us']:8.2f} {r['bf16_us'] / r['ours_us']:5.2f} {b:8.2f} {r['bf16_us'] / b:5.2f} "
              f"{r['packed_GBps']:5.0f} {100 * r['packed_GBps'] / ceiling:5.1f} {best_gbps:6.0f} "
              f"{100 * best_gbps / ceiling:5.1f} {r['rel_err']:7.1e}")
    if any("read_us" in r for r in rows):
        print("\nread floor: the fastest kernel that only reads the packed bytes once (read_floor.py); "
              "bf16 / read floor: about the most any W4A16 kernel can reach")
        print(f"{'shape':13} {'N x K':>11} {'M':>5} {'bf16 us':>8} {'read us':>8} {'max x':>6} {'best x':>6}  read config")
        for r in rows:
            if "read_us" in r:
                print(f"{r['shape']:13} {str(r['N']) + 'x' + str(r['K']):>11} {r['M']:>5} {r['bf16_us']:8.2f} "
                      f"{r['read_us']:8.2f} {r['bf16_us'] / r['read_us']:6.2f} {r['bf16_us'] / r['best_us']:6.2f}  "
                      f"{r['read_cfg']}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--no-sweep", action="store_true", help="time only the dispatch")
    ap.add_argument("--fast", action="store_true", help=f"the <= 60 s run: shapes {FAST_SHAPES}, M "
                    f"{FAST_BATCHES}, the {len(FAST_GRID)}-config FAST_GRID (explicit flags still override)")
    ap.add_argument("--tma", action="store_true", help=f"the TMA variants: shapes {FAST_SHAPES}, M 1,8, the "
                    f"{len(TMA_GRID)}-config TMA_GRID (explicit flags still override)")
    ap.add_argument("--shapes", default=None, help="comma list of shape indexes (0-5) or NxK (e.g. 16384x2048), "
                    "or 'all'")
    ap.add_argument("--batches", default=None, help="comma list of M values (default 1,8,32,4096)")
    ap.add_argument("--quick", action="store_true", help="an 18-config grid (waves 4 only) instead of 54")
    ap.add_argument("--read-floor", action="store_true",
                    help="also time the fastest kernel that only reads each shape's packed bytes (read_floor.py)")
    ap.add_argument("--configs", default="", help="tensor-core configs to sweep instead of the default grid: "
                    "'bn=64,w=4,bias=0,un=2,pf=1,waves=4,stages=1,red=4[,split=8];...'")
    ap.add_argument("--glu", action="store_true", help="only gate+up + silu_mul vs the GLU epilogue (--batches)")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("needs a CUDA GPU")
    os.makedirs(args.out, exist_ok=True)         # before the measurements, not after them
    torch.backends.cuda.matmul.allow_tf32 = False
    gen = torch.Generator(device="cuda").manual_seed(0)
    sms = sm_count(torch.device("cuda"))
    log = lambda m: print(m, file=sys.stderr, flush=True)  # noqa: E731
    if args.glu:
        rows = bench_glu([int(m) for m in (args.batches or "1,8,32").split(",")], gen, log)
        out = os.path.join(args.out, "w4a16_glu_bench.json")
        with open(out + ".tmp", "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "rows": rows}, f, indent=1)
        os.replace(out + ".tmp", out)
        if not all(r["equal"] for r in rows):
            sys.exit("the GLU epilogue differs from gate+up then silu_mul")
        return
    import triton
    grid = [] if args.no_sweep else (parse_configs(args.configs) if args.configs else TMA_GRID if args.tma
                                     else FAST_GRID if args.fast else QUICK_GRID if args.quick else DEFAULT_GRID)
    batches = [int(m) for m in (args.batches or ("1,8" if args.tma else FAST_BATCHES if args.fast
                                                 else "1,8,32,4096")).split(",")]
    shape_arg = args.shapes or (FAST_SHAPES if args.fast or args.tma else "0,1,2,3")
    shapes = SHAPES if shape_arg == "all" else [parse_shape(t) for t in shape_arg.split(",")]
    cfgs = [default_tc_config(M, N, K, sms) for _, N, K in shapes for M in batches if M < DEQUANT_MIN_ROWS]
    cfgs += [tc_config_from_spec(spec, M, N, K, sms) for _, N, K in shapes for M in batches if M <= 64
             for spec in grid]
    # the kernel's compile key for M > 1, split_k > 1 (M = 1 / split 1 compile on first use)
    try:
        precompile(list(dict.fromkeys(TCConfig(c.block_n, c.block_m, 2, c.num_warps, c.num_stages, c.bias_dot,
                                               c.unroll, c.prefetch, c.reduce, c.tma, c.tma_blocks) for c in cfgs)),
                   log)
    except Exception as ex:       # the sweep still runs, compiling each kernel when it first runs
        log(f"parallel precompile failed ({type(ex).__name__}: {ex}); compiling serially")
    ceiling = copy_bandwidth()
    log(f"{torch.cuda.get_device_name()} | {sms} SMs | copy ceiling {ceiling:.0f} GB/s | torch {torch.__version__} "
        f"| triton {triton.__version__}")
    rows = []
    for name, N, K in shapes:
        rows += bench_shape(name, N, K, batches, gen, sms, grid, log, args.read_floor)
        torch.cuda.empty_cache()
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
    wrong = [f"{r['shape']} M={r['M']} {w}" for r in rows for w in r["wrong"]]
    if wrong:
        print("\nWRONG / FAILED (excluded from the timings):\n  " + "\n  ".join(wrong))
        sys.exit(f"{len(wrong)} variants over the {MAX_ERR} error bound or failing")


if __name__ == "__main__":
    main()

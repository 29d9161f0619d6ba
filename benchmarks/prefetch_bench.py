"""L2 weight prefetch in the decode step: does queueing the next GEMM's weights into L2 (ops/prefetch.py)
fill the DRAM-idle gaps between GEMMs? One GPU, in one run.

    python benchmarks/prefetch_bench.py [--only micro,bf16,w4a16] [--mb 0,8,16,32] [--out DIR]

1. micro: per weight copy (rotated over > 500 MB, so nothing is left in L2), a 10 µs sleep kernel
   (the gap) then the GEMM at one row; with a prefetch of its first 32 MB queued on a side stream
   before the gap, and with the whole matrix prefetched at the GEMM's start (no gap), for each
   prefetch launch shape (ops/prefetch.py PREFETCH_CONFIGS). µs per (gap +) GEMM from CUDA-graph
   replays, median;
2. the engine (`sala-9b` random bf16 weights, random synthetic caches): decode replay time at b1 /
   b8 / b32 4K and b1 128K for each prefetch size (`model.l2_prefetch_bytes`, graphs re-captured;
   tests/test_gpu_engine.py checks that prefetching leaves the decoded tokens unchanged);
3. the same model quantized in memory (RTN W4A16 g128): b1 / b8 at 4K.
Results: $OUT/prefetch_bench.json (or --out), a table last.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import gpu_engine_bench as G  # noqa: E402
from timing import events_time  # noqa: E402

RESULTS: dict = {}


def _graph_us(body, per: int) -> float:
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        body()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        body()
    return events_time(g.replay, reps=15) / per * 1e6


def micro():
    from salactl.quant.linear import W4A16Linear
    from salactl.runtime.ops.gemv.triton import linear
    from salactl.runtime.ops import prefetch as P
    from salactl.runtime.ops.prefetch import l2_prefetch

    default = P.CONFIG
    side = torch.cuda.Stream()
    out = {}
    x = torch.randn(1, 4096, device="cuda", dtype=torch.bfloat16)
    cases = {"bf16 4096x4096": [torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16) for _ in range(16)],
             "bf16 16384x4096": [torch.randn(16384, 4096, device="cuda", dtype=torch.bfloat16) for _ in range(4)]}
    for n in (4096, 16384):
        mods = []
        for _ in range(64 if n == 4096 else 16):
            q = torch.randint(-2 ** 31, 2 ** 31 - 1, (512, n), dtype=torch.int32)
            s = torch.rand(32, n) * 0.01 + 0.001
            mods.append(W4A16Linear.from_gptq(q, s.half(), None, 4, 128, "cuda", torch.bfloat16))
        cases[f"w4a16 {n}x4096"] = mods
    sleep_cycles = 20000             # ~10 us at the H200's ~1.98 GHz
    for name, ws in cases.items():
        def data(w):
            return w if isinstance(w, torch.Tensor) else w.qweight

        def gemm(w):
            return linear(x, w) if isinstance(w, torch.Tensor) else w(x)

        row = {"mb": data(ws[0]).numel() * data(ws[0]).element_size() / 2 ** 20}

        def run(pf_mb, gap=True, whole=False):
            def body():
                for w in ws:
                    if pf_mb or whole:
                        side.wait_stream(torch.cuda.current_stream())
                        with torch.cuda.stream(side):
                            l2_prefetch(data(w), (1 << 40) if whole else int(pf_mb * 2 ** 20))
                    if gap:
                        torch.cuda._sleep(sleep_cycles)
                    gemm(w)
                if pf_mb or whole:
                    torch.cuda.current_stream().wait_stream(side)
            return _graph_us(body, len(ws))

        row["gap_only_us"] = _graph_us(lambda: [torch.cuda._sleep(sleep_cycles) for _ in ws], len(ws))
        row["gemm_us"] = run(0, gap=False)
        row["gap_gemm_us"] = run(0)
        for cfg in P.PREFETCH_CONFIGS:
            P.CONFIG = cfg
            tag = "c{}x{}w{}".format(*cfg)
            row[f"whole_{tag}_us"] = run(0, gap=False, whole=True)
            row[f"gap_pf32_{tag}_us"] = run(32)
        P.CONFIG = default
        out[name] = row
        print(f"   {name}: {json.dumps({k: round(v, 2) for k, v in row.items()})}", flush=True)
    return out


def engine_cases(model, ceil, mbs, cases, label):
    from salactl.runtime.gpu.engine import GPUEngine
    from salactl.runtime.gpu.fast_model import plan_prefetch

    engine = GPUEngine(model, "cuda", max_running_requests=32, chunk_size=4096, max_context=131072 + 512)
    engine.pools.k.normal_()
    engine.pools.v.normal_()
    engine.pools.state.normal_(std=0.01)
    r = engine.runner
    out = {}
    for n, ctx in cases:
        syn = G.Synthetic(engine, n, ctx)
        sparse = ctx + 1 >= engine.config.sparse_config.dense_len
        floor = G.decode_bytes(engine.config, model, n, ctx) / (ceil * 1e12)
        row = {"floor_ms": floor * 1e3}
        try:
            for mb in mbs:
                model.l2_prefetch_bytes = int(mb * 2 ** 20)
                plan_prefetch(model)
                r.reset_graphs()
                for i in range(2):
                    r.decode(syn.rows(i))
                graph, _ = r.graphs[(r.bucket(n), sparse)]
                t = events_time(graph.replay, reps=30)
                row[f"pf{mb}_ms"] = t * 1e3
                row[f"pf{mb}_pct"] = 100 * floor / t
        finally:
            syn.close()
        out[f"b{n}_ctx{ctx}"] = row
        print(f"   {label} b{n} ctx{ctx}: {json.dumps({k: (round(v, 3) if isinstance(v, float) else v) for k, v in row.items()})}",
              flush=True)
    model.l2_prefetch_bytes = 0
    plan_prefetch(model)
    del engine
    gc.collect()
    torch.cuda.empty_cache()
    return out


def table(mbs):
    lines = ["", "| case | " + " | ".join(f"pf {mb} MB" for mb in mbs) + " |",
             "|---|" + "---|" * len(mbs)]
    for label in ("bf16", "w4a16"):
        for key, row in RESULTS.get(label, {}).items():
            cells = [f"{row[f'pf{mb}_ms']:.3f} ms ({row[f'pf{mb}_pct']:.1f}%)" if f"pf{mb}_ms" in row else "-"
                     for mb in mbs]
            lines.append(f"| {label} {key} | " + " | ".join(cells) + " |")
    for name, row in RESULTS.get("micro", {}).items():
        rest = ", ".join(f"{k[:-3]} {v:.1f}" for k, v in row.items() if k.startswith(("whole_", "gap_pf")))
        lines.append(f"| micro {name} ({row['mb']:.0f} MB) | gemm {row['gemm_us']:.1f} us; gap {row['gap_only_us']:.1f}; "
                     f"gap+gemm {row['gap_gemm_us']:.1f}; {rest} | |")
    print("\n".join(lines))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", default="micro,bf16,w4a16")
    ap.add_argument("--mb", default="0,8,16,32")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    out = Path(args.out or os.environ.get("OUT", "out"))
    mbs = [float(v) if "." in v else int(v) for v in args.mb.split(",")]
    only = set(args.only.split(","))
    c = G.ceilings()
    RESULTS["ceilings"] = c
    ceil = c["copy_tb_s"]
    print(f"== copy {ceil:.2f} TB/s", flush=True)
    if "micro" in only:
        RESULTS["micro"] = micro()
        from salactl.runtime.ops import prefetch as P

        row = RESULTS["micro"]["bf16 4096x4096"]          # the engine runs with the best shape there
        P.CONFIG = min(P.PREFETCH_CONFIGS, key=lambda c: row["gap_pf32_c{}x{}w{}_us".format(*c)])
        RESULTS["engine_prefetch_config"] = P.CONFIG
        print(f"== engine prefetch launch shape {P.CONFIG}", flush=True)
    if only & {"bf16", "w4a16"}:
        from salactl.runtime.loader import load_model

        t0 = time.perf_counter()
        lm = load_model("sala-9b", "cuda", "bf16", random_weights=True, seed=0)
        print(f"== model loaded in {time.perf_counter() - t0:.1f}s", flush=True)
        if "bf16" in only:
            RESULTS["bf16"] = engine_cases(lm.model, ceil, mbs, ((1, 4096), (8, 4096), (32, 4096), (1, 131072)),
                                           "bf16")
        if "w4a16" in only:
            from salactl.profiling.weights import quantize_rtn_in_memory

            model = quantize_rtn_in_memory(lm.model, lm.config)
            gc.collect()
            torch.cuda.empty_cache()
            RESULTS["w4a16"] = engine_cases(model, ceil, mbs, ((1, 4096), (8, 4096)), "w4a16")
    out.mkdir(parents=True, exist_ok=True)
    (out / "prefetch_bench.json").write_text(json.dumps(RESULTS, indent=1, default=str))
    table(mbs)


if __name__ == "__main__":
    main()

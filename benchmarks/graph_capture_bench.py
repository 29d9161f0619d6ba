"""Bench phases on the GPU engine with its decode CUDA graphs captured lazily (inside the timed
phase, as before e3ab863) and ahead (Target.prepare before the clock), on one warm process.

    python benchmarks/graph_capture_bench.py [--model sala-9b] [--concurrency 8] [--requests 32]
        [--input-len 1024] [--output-len 128]

Each mode builds a fresh GPUEngine on the same model (random bf16 weights), so the lazy one starts
with no graph captured; the Triton kernels are compiled once by a throwaway engine first, so
neither mode pays for JIT (only capture and the per-bucket warm-up forwards differ). Prints TTFT
and ITL percentiles (of the requests that completed), completed/requests, request throughput and
the untimed prepare time of each mode; writes $OUT/graph_capture.json. Exit status 1 when any
request failed (each mode's count and first error named after the table).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import time
from pathlib import Path

import numpy as np
import torch


def run_mode(model, ahead: bool, args, requests) -> dict:
    from salactl.bench.profiles import Phase
    from salactl.bench.runner import run_phase
    from salactl.bench.targets.embedded import EmbeddedTarget
    from salactl.bench.targets.engine_driver import EngineDriver, GpuStepper
    from salactl.runtime.gpu.engine import GPUEngine

    engine = GPUEngine(model, args.device, max_running_requests=64, chunk_size=8192)
    target = EmbeddedTarget(EngineDriver(GpuStepper(engine), 64), args.model, model.config.vocab_size,
                            torch.device(args.device))
    prepare_s = []
    real_prepare = target.prepare

    def prepare(*args):
        t0 = time.perf_counter()
        if ahead:
            real_prepare(*args)
        prepare_s.append(time.perf_counter() - t0)

    target.prepare = prepare
    try:
        out = run_phase(target, Phase("S", max_concurrency=args.concurrency), requests)
    finally:
        target.close()
    ok = [r for r in out.results if r.success]
    failed = [r for r in out.results if not r.success]
    ttft = np.array([r.ttft for r in ok]) * 1e3
    itl = np.array([x for r in ok for x in r.itl]) * 1e3
    row = {"mode": "ahead" if ahead else "lazy", "completed": len(ok), "requests": len(out.results),
           "duration_s": out.duration, "graphs": len(engine.runner.graphs), "prepare_s": prepare_s[0],
           **percentiles("ttft_ms", ttft), **percentiles("itl_ms", itl),
           "req_per_s": len(ok) / out.duration}
    if failed:
        row["first_error"] = failed[0].error
    del engine, target
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return row


def percentiles(name: str, ms) -> dict:
    """p50, p99 and max of `ms`; NaN where nothing completed to measure."""
    if not len(ms):
        return {f"{name}_p50": float("nan"), f"{name}_p99": float("nan"), f"{name}_max": float("nan")}
    return {f"{name}_p50": float(np.median(ms)), f"{name}_p99": float(np.percentile(ms, 99)),
            f"{name}_max": float(ms.max())}


def report(rows: list[dict]) -> int:
    """Print the table of `rows` (completed/requests in each), then name the modes where requests
    failed (stderr); 1 when any request failed, else 0."""
    cols = ("mode", "completed", "graphs", "prepare_s", "duration_s", "ttft_ms_p50", "ttft_ms_p99", "ttft_ms_max",
            "itl_ms_p50", "itl_ms_p99", "itl_ms_max", "req_per_s")
    print(" | ".join(cols))
    for r in rows:
        cells = {**r, "completed": f"{r['completed']}/{r['requests']}"}
        print(" | ".join(f"{cells[c]:.2f}" if isinstance(cells[c], float) else str(cells[c]) for c in cols))
    bad = [(i, r) for i, r in enumerate(rows) if r["completed"] < r["requests"]]
    for i, r in bad:
        print(f"graph_capture_bench.py: run {i + 1} ({r['mode']}): {r['requests'] - r['completed']} of "
              f"{r['requests']} requests failed; the first: {r.get('first_error')}", file=sys.stderr)
    return 1 if bad else 0


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="sala-9b")
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--requests", type=int, default=32)
    ap.add_argument("--input-len", type=int, default=1024)
    ap.add_argument("--output-len", type=int, default=128)
    ap.add_argument("--device", default="cuda")
    args = ap.parse_args()

    from salactl.bench.synthetic import random_lengths
    from salactl.runtime.gpu.engine import GPUEngine
    from salactl.runtime.loader import load_model
    from salactl.runtime.sampling import SamplingParams

    model = load_model(args.model, args.device, "bf16", random_weights=True, seed=0).model
    requests = random_lengths(args.requests, args.input_len, args.output_len, model.config.vocab_size,
                              range_ratio=0.5, seed=1)      # mixed lengths: the running batch size varies
    t0 = time.perf_counter()            # compile every kernel once (eager steps at several batch sizes)
    jit = GPUEngine(model, args.device, max_running_requests=64, chunk_size=8192, cuda_graph=False)
    jit.generate_batch([(list(r.prompt_ids), SamplingParams(max_new_tokens=4, ignore_eos=True))
                        for r in requests[:args.concurrency]])
    del jit
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    print(f"kernels compiled in {time.perf_counter() - t0:.1f} s", flush=True)
    rows = [run_mode(model, ahead, args, requests) for ahead in (False, True, False, True)]
    out = Path(os.environ.get("OUT", "out"))
    out.mkdir(parents=True, exist_ok=True)
    (out / "graph_capture.json").write_text(json.dumps({"args": vars(args), "rows": rows,
                                                        "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"}, indent=1))
    return report(rows)


if __name__ == "__main__":
    sys.exit(main())

"""Decode tok/s of the reference Engine on CPU with a bf16 (activation dtype) and an FP8 KV cache,
after the same long random prompt; rounds alternate between the caches, the best round counts.

    python benchmarks/cpu_fp8_kv_decode.py --context 8192 --tokens 16 --rounds 3
"""

from __future__ import annotations

import argparse
import random
import time

import torch

from salactl.runtime.engine import Engine
from salactl.runtime.loader import load_model


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None, help="checkpoint or preset (default: sala-nano)")
    ap.add_argument("--context", type=int, default=8192)
    ap.add_argument("--tokens", type=int, default=16, help="decode steps per round")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--kv", default="bf16,fp8_e5m2", help="comma-separated --kv-cache-dtype values")
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    for name in ("context", "tokens", "rounds", "threads"):
        if getattr(args, name) < 1:
            raise SystemExit(f"cpu_fp8_kv_decode.py: --{name} must be at least 1, got {getattr(args, name)}")
    torch.set_num_threads(args.threads)
    rng = random.Random(0)
    prompt = [rng.randint(10, 3999) for _ in range(args.context)]
    lm = load_model(args.model, "cpu")
    engines = {kv: Engine(lm.model, "cpu", kv_cache_dtype=kv) for kv in args.kv.split(",")}
    seqs = {}
    for kv, eng in engines.items():
        seqs[kv] = eng.new_sequence()
        eng.prefill(seqs[kv], prompt)
    best = dict.fromkeys(engines, 0.0)
    for r in range(args.rounds):
        for kv, eng in engines.items():
            t = time.perf_counter()
            for i in range(args.tokens):
                eng.forward(seqs[kv], [100 + i])
            best[kv] = max(best[kv], args.tokens / (time.perf_counter() - t))
    print(f"decode tok/s after {args.context} tokens (best of {args.rounds} alternating rounds of {args.tokens}):")
    for kv, tps in best.items():
        print(f"  {kv:10s} {tps:7.1f}")


if __name__ == "__main__":
    main()

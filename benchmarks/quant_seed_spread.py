"""GPTQ/RTN perplexity-increase ratio on sala-nano over several calibration seeds, on CPU.

    python benchmarks/quant_seed_spread.py [--seeds 0,1,2,3,4] [--nsamples 64] [--seqlen 512]
        [--quantize-arg=--no-clip-search ...] [--out FILE]

For each seed (`salactl quantize --seed`: the order of the built-in corpus' documents, so which text
calibrates) a GPTQ checkpoint is written with `salactl quantize` and scored as quant_quality.py
scores it (held-out perplexity, bf16, 16384 tokens in 1024-token windows); RTN needs no calibration,
so one RTN checkpoint serves every seed. A single seed is not a measurement: on sala-nano the ratio
moves by tens of points between seeds, and even between thread counts (float summation order).
Prints one JSON object (per-seed rows, mean, min, max).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from quant_quality import ppl


def quantize(out: Path, extra: list[str]) -> None:
    subprocess.run([sys.executable, "-m", "salactl", "quantize", "--model", "sala-nano", "--out", str(out),
                    "--device", "cpu", "--dtype", "float32", "--json", *extra],
                   check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def score(path) -> float:
    from salactl.data.corpus import corpus_text
    from salactl.runtime.loader import load_model
    from salactl.runtime.tokenizer import find_tokenizer

    lm = load_model(str(path), "cpu", "bfloat16")
    ids = find_tokenizer(None, lm.model_dir).encode(corpus_text("heldout"))
    return ppl(lm.model, ids, 1024, 16384, lm.config.bos_token_id)["ppl"]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", default="0,1,2,3,4")
    ap.add_argument("--nsamples", type=int, default=64)
    ap.add_argument("--seqlen", type=int, default=512)
    ap.add_argument("--quantize-arg", action="append", default=[], help="extra `salactl quantize` argument")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    log = lambda m: print(m, file=sys.stderr, flush=True)  # noqa: E731
    with tempfile.TemporaryDirectory() as tmp:
        base = score("sala-nano")
        quantize(Path(tmp) / "rtn", ["--method", "rtn"])
        rtn = score(Path(tmp) / "rtn")
        log(f"bf16 {base:.4f}, RTN {rtn:.4f}")
        rows = []
        for seed in (int(s) for s in args.seeds.split(",")):
            out = Path(tmp) / f"gptq{seed}"
            quantize(out, ["--seed", str(seed), "--nsamples", str(args.nsamples), "--seqlen", str(args.seqlen),
                           *args.quantize_arg])
            p = score(out)
            rows.append({"seed": seed, "ppl": p, "ratio": (p - base) / (rtn - base)})
            log(f"seed {seed}: ppl {p:.4f}, GPTQ increase / RTN increase {rows[-1]['ratio']:.1%}")
    ratios = [r["ratio"] for r in rows]
    res = {"bf16_ppl": base, "rtn_ppl": rtn, "quantize_args": args.quantize_arg, "calibration":
           f"{args.nsamples}x{args.seqlen}", "threads": os.environ.get("OMP_NUM_THREADS"), "rows": rows,
           "mean_ratio": statistics.mean(ratios), "min_ratio": min(ratios), "max_ratio": max(ratios)}
    text = json.dumps(res, indent=1)
    if args.out:
        Path(args.out).write_text(text)
    print(text)


if __name__ == "__main__":
    main()

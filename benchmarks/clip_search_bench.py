"""GPTQ's clip search on the GPU: the candidates scored together (the default on CUDA) against one at a
time (the CPU's way), on the 9B's projection shapes with a random calibration Hessian.

Checks that both pick the same scales (group by group and through whole GPTQ solves), then times a
whole `gptq_quantize` (act-order, static groups, g128) with the search scored together, one at a time,
and off, as the median of several solves (after one untimed) synchronised with CUDA events. Prints a
table; exit status 1 when the two ways picked different scales or codes for any linear.

    cd benchmarks && python clip_search_bench.py [--reps 5]
"""

from __future__ import annotations

import argparse
import statistics
import sys

import torch

import salactl.quant.quantizer as quantizer
from salactl.quant.gptq import Hessian, gptq_quantize, prepare_hessian
from salactl.quant.quantizer import QuantSpec, clipped_group_scale

SHAPES = {"qkvz / o (4096x4096)": (4096, 4096), "gate or up (16384x4096)": (16384, 4096),
          "down (4096x16384)": (4096, 16384)}
TOKENS = 8192


def hessian(k: int, gen: torch.Generator) -> torch.Tensor:
    x = torch.randn(TOKENS, k, device="cuda", generator=gen) * torch.rand(k, device="cuda", generator=gen) * 2
    h = Hessian(k, "cuda")
    h.add(x)
    return h.h


def timed_solve(w, prep, spec, clip: bool, reps: int):
    times, out = [], None
    gptq_quantize(w, prep, spec, clip_search=clip)      # warm-up: kernels compiled, allocator grown
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        out = gptq_quantize(w, prep, spec, clip_search=clip)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return statistics.median(times), out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args()
    if args.reps < 1:
        sys.exit(f"clip_search_bench.py: --reps must be at least 1, got {args.reps}")
    if not torch.cuda.is_available():
        sys.exit("clip_search_bench.py: needs a CUDA GPU")
    gen = torch.Generator("cuda").manual_seed(0)
    spec = QuantSpec(4, 128, bf16_exact_scales=True)
    together = quantizer._CLIP_CHUNK_ELEMENTS["cuda"]
    rows = []
    for name, (n, k) in SHAPES.items():
        w = torch.randn(n, k, device="cuda", generator=gen) * 0.02
        w[::7, ::97] *= 8
        prep = prepare_hessian(hessian(k, gen), 0.01, True, name)
        cw = torch.diagonal(prep.raw)[:128].float()
        quantizer._CLIP_CHUNK_ELEMENTS["cuda"] = 1
        one_scale = clipped_group_scale(w[:, :128], spec, cw)
        one_t, one = timed_solve(w, prep, spec, True, args.reps)
        quantizer._CLIP_CHUNK_ELEMENTS["cuda"] = together
        same = torch.equal(clipped_group_scale(w[:, :128], spec, cw), one_scale)
        tog_t, tog = timed_solve(w, prep, spec, True, args.reps)
        off_t, _ = timed_solve(w, prep, spec, False, args.reps)
        same = same and torch.equal(tog.scales, one.scales) and torch.equal(tog.codes, one.codes)
        rows.append((name, same, tog_t, one_t, off_t))
        print(f"{name}: same choice {same}; solve {tog_t:.3f} s together, {one_t:.3f} s one at a time, "
              f"{off_t:.3f} s without the search", flush=True)
    print(f"\n{torch.cuda.get_device_name()}, torch {torch.__version__}, median of {args.reps} solves")
    print("| linear | same scales | search scored together | one at a time | no search |")
    print("|---|---|---|---|---|")
    for name, same, a, b, c in rows:
        print(f"| {name} | {'yes' if same else '**NO**'} | {a:.3f} s | {b:.3f} s | {c:.3f} s |")
    differ = [name for name, same, *_ in rows if not same]
    if differ:
        print(f"clip_search_bench.py: the search scored together picked other scales than one at a time: "
              f"{'; '.join(differ)}", file=sys.stderr)
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())

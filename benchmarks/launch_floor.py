"""The smallest cost of one dependent phase of GPU work on this machine: what a chain of kernels, or
one kernel with grid-wide barriers, pays per phase before moving any bytes. It bounds from below
any design that splits a decode op into dependent steps (BENCHMARKS.md, GPU engine session 27:
the sparse decode path at 128K, whose selection and attention are 4-6 dependent steps).

    cd benchmarks && python launch_floor.py [--programs 1,132,264,528]

Per grid size, medians over CUDA-graph replays of chains of 64 calls (timing.py):
- empty: each kernel only waits for its predecessor (PDL on, as in the engine) and exits;
- dependent: each kernel loads what the previous one stored (one 4-byte word per program) and
  stores it + 1: the L2 round trip a real phase adds to its launch;
- the same two without PDL;
- barrier: one kernel of that many resident programs crossing 64 grid-wide barriers (an atomic
  arrival count, then spinning on it), per barrier.
The dependent chain is checked (the words after the chain = 64 per call).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parent))
from timing import graph_time_us  # noqa: E402

from salactl.runtime.ops.pdl import launch_args, pdl_wait  # noqa: E402

CHAIN = 64


@triton.jit
def _empty_kernel(ptr, PDL: tl.constexpr):
    pdl_wait(PDL)


@triton.jit
def _dependent_kernel(src, dst, PDL: tl.constexpr):
    pdl_wait(PDL)
    pid = tl.program_id(0)
    tl.store(dst + pid, tl.load(src + pid) + 1)


@triton.jit
def _barrier_kernel(ctr, BARRIERS: tl.constexpr):
    n = tl.num_programs(0)
    for i in range(BARRIERS):
        tl.atomic_add(ctr, 1, sem="release")
        target = (i + 1) * n
        seen = tl.atomic_add(ctr, 0, sem="acquire")
        while seen < target:
            seen = tl.atomic_add(ctr, 0, sem="acquire")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--programs", default="1,132,264,528")
    a = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("launch_floor.py: needs a CUDA GPU")
    dev = torch.device("cuda")
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    rows, bad = [], []
    for n in (int(v) for v in a.programs.split(",")):
        bufs = [torch.zeros(n, dtype=torch.int32, device=dev) for _ in range(2)]
        row = {"programs": n}
        for pdl in (True, False):
            kw = launch_args(dev) if pdl else {"PDL": False, "launch_pdl": False}
            tag = "pdl" if pdl else "plain"
            row[f"empty {tag}"] = graph_time_us([lambda: _empty_kernel[(n,)](bufs[0], num_warps=1, **kw)] * CHAIN)
            calls = [lambda i=i: _dependent_kernel[(n,)](bufs[i % 2], bufs[1 - i % 2], num_warps=1, **kw)
                     for i in range(CHAIN)]
            row[f"dependent {tag}"] = graph_time_us(calls)
            bufs[0].zero_()
            for c in calls:
                c()
            if not torch.equal(bufs[0], torch.full_like(bufs[0], CHAIN)):
                bad.append(f"dependent chain {tag} at {n} programs: {bufs[0][:4].tolist()}")
        if n <= 4 * sms:                                  # every program resident (1 warp each)
            ctr = torch.zeros(1, dtype=torch.int32, device=dev)

            def barriers(k):
                ctr.zero_()
                _barrier_kernel[(n,)](ctr, BARRIERS=k, num_warps=1)

            t1, t65 = graph_time_us([lambda: barriers(1)]), graph_time_us([lambda: barriers(CHAIN + 1)])
            row["barrier"] = (t65 - t1) / CHAIN
            if int(ctr.item()) != n * (CHAIN + 1):
                bad.append(f"barrier at {n} programs: count {int(ctr.item())}")
        rows.append(row)
        print(row, flush=True)
    cols = ["empty pdl", "dependent pdl", "empty plain", "dependent plain", "barrier"]
    print("\nus per phase (CUDA-graph replay, medians)\n")
    print("| programs | " + " | ".join(cols) + " |")
    print("|---|" + "---|" * len(cols))
    for r in rows:
        print(f"| {r['programs']} | " + " | ".join(f"{r[c]:.2f}" if c in r else "—" for c in cols) + " |")
    for b in bad:
        print("WRONG:", b)
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())

"""What a W4A16 projection gains when part of its weights were fetched into L2 during the idle
window before it (runtime/ops/l2_ahead.py). One GPU; table last.

    cd benchmarks && python l2_ahead_bench.py [--shapes 0,2,3,4,5] [--batches 1,8]
        [--windows 2,6] [--fractions 0.125,0.25,0.5,1]

Per (shape, M, window W us, fraction f) a CUDA graph of calls rotating over > 200 MB of weight
copies (no L2 reuse between calls), each call being
    base:     sleep(W) -> projection
    ahead f:  fork: bulk L2 prefetch of the first f of each split range -> | sleep(W) -> projection -> join
minus the same graph of windows alone: the time from a window's end to the projection's end, i.e.
what the projection costs in a step when its first weights were fetched during the window. Every call is
checked against the fp32 dequant-matmul first. Medians of replays (timing.py).
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from timing import graph_time_us  # noqa: E402
from w4a16_bench import GROUP, MAX_ERR, ROTATE_BYTES, SHAPES, make_shape, rel_err  # noqa: E402

from salactl.runtime.ops.l2_ahead import prefetch_chunks  # noqa: E402
from salactl.runtime.ops.w4a16.layout import K_BLOCK  # noqa: E402
from salactl.runtime.ops.w4a16.tc_config import default_tc_config, launch_split, split_blocks  # noqa: E402
from salactl.runtime.ops.w4a16.triton import sm_count, w4a16_linear  # noqa: E402


def cycles_per_us() -> float:
    """The SM clock, from a timed torch.cuda._sleep."""
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda._sleep(1_000_000)
    e0.record()
    torch.cuda._sleep(10_000_000)
    e1.record()
    torch.cuda.synchronize()
    return 10_000_000 / (e0.elapsed_time(e1) * 1e3)


def chunks_of(M: int, N: int, K: int) -> int:
    cfg = default_tc_config(M, N, K, sm_count(torch.device("cuda")))
    kbs = split_blocks(K, launch_split(cfg, K), cfg.tma_blocks if cfg.tma else 1)
    return math.ceil((K // K_BLOCK) / kbs)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default="0,2,3,4,5")
    ap.add_argument("--batches", default="1,8")
    ap.add_argument("--windows", default="2,6")
    ap.add_argument("--fractions", default="0.125,0.25,0.5,1")
    a = ap.parse_args()
    gen = torch.Generator(device="cuda").manual_seed(0)
    cpu = cycles_per_us()
    side = torch.cuda.Stream()
    rows, bad = [], []
    print(f"SM clock {cpu:.0f} cycles/us", flush=True)
    for si in (int(s) for s in a.shapes.split(",")):
        name, N, K = SHAPES[si]
        d = make_shape(N, K, gen)
        nbytes = d["q"].numel() * 4 + d["s"].numel() * 2
        ncopy = max(2, math.ceil(ROTATE_BYTES / nbytes))
        copies = [(d["q"].clone(), d["s"].clone()) for _ in range(ncopy)]
        for M in (int(b) for b in a.batches.split(",")):
            x = torch.randn(M, K, device="cuda", generator=gen).bfloat16()
            err = rel_err(w4a16_linear(x, *copies[0], GROUP), x.float() @ d["w_ref"].t())
            if err > MAX_ERR:
                bad.append(f"{name} M={M}: rel err {err:.3g}")
                continue
            chunks = chunks_of(M, N, K)
            for W in (float(w) for w in a.windows.split(",")):
                cyc = int(W * cpu)

                def call(i, f, proj):
                    q, s = copies[i % ncopy]
                    if f > 0:
                        side.wait_stream(torch.cuda.current_stream())
                        with torch.cuda.stream(side):
                            prefetch_chunks(q, chunks, f)
                            prefetch_chunks(s, chunks, f)
                    torch.cuda._sleep(cyc)
                    if proj:
                        w4a16_linear(x, q, s, GROUP)
                    if f > 0:
                        torch.cuda.current_stream().wait_stream(side)

                sleep = graph_time_us([lambda i=i: call(i, 0.0, False) for i in range(ncopy)])
                t = {f: graph_time_us([lambda i=i, f=f: call(i, f, True) for i in range(ncopy)]) - sleep
                     for f in [0.0] + [float(v) for v in a.fractions.split(",")]}
                row = {"shape": name, "M": M, "W": W, "chunks": chunks, **{f"f={f:g}": v for f, v in t.items()}}
                rows.append(row)
                print(" ".join(f"{k}={v:.2f}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items()),
                      flush=True)
        copies.clear()
    fr = [0.0] + [float(v) for v in a.fractions.split(",")]
    print("\n| shape | M | window us | splits | " + " | ".join(f"proj us, f={f:g}" for f in fr) + " |")
    print("|---|---|---|---|" + "---|" * len(fr))
    for r in rows:
        print(f"| {r['shape']} | {r['M']} | {r['W']:g} | {r['chunks']} | "
              + " | ".join(f"{r[f'f={f:g}']:.2f}" for f in fr) + " |")
    for b in bad:
        print("WRONG:", b)
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())

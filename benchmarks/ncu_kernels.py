"""Nsight Compute on single decode kernels in isolation: why a kernel sits where it does (DRAM %
of peak, issue utilisation, occupancy, warp stall reasons), for the cases whose speed targets are
still missed. One GPU with ncu; the table per case last.

    python benchmarks/ncu_kernels.py [--cases w4a16_gateup,w4a16_o,attn_fp8,attn_bf16,skinny_o32] [--out DIR]

Each case re-runs this script under `ncu --kernel-name regex:<kernel> --launch-skip 4 --launch-count 1`
with the SpeedOfLight, Occupancy, LaunchStats, WarpStateStats, SchedulerStats and
MemoryWorkloadAnalysis sections (ncu flushes the caches before each pass: DRAM-cold, like the
rotating benchmarks), and prints the metrics that decide between latency-, issue- and
bandwidth-bound (stall reasons: warps stalled per issued instruction, by reason). Inputs: random, the 9B shapes (W4A16 GPTQ g128 at one row, decode attention of
one layer at 128K / batch 1, the skinny o_proj at 32 rows, the decode selection's passes at 1M + 100
and its rank top-k at 128K + 100 over compressed random keys, as sparse_decode_bench.py).
"""

from __future__ import annotations

import argparse
import csv
import io
import os
import subprocess
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

KERNELS = {"w4a16_gateup": "_w4a16_tc_kernel", "w4a16_o": "_w4a16_tc_kernel", "attn_fp8": "_split_kernel",
           "attn_bf16": "_split_kernel", "skinny_o32": "_skinny_kernel",
           "sel_words_1m": "_block_words_kernel", "sel_lse_1m": "_lse_kernel", "sel_rank_128k": "_rank_kernel"}
SECTIONS = ("SpeedOfLight", "Occupancy", "LaunchStats", "WarpStateStats", "SchedulerStats", "MemoryWorkloadAnalysis")
KEEP = ("Duration", "DRAM Throughput", "Memory Throughput", "Compute (SM) Throughput", "Registers Per Thread",
        "Achieved Occupancy", "Theoretical Occupancy", "Block Limit", "Issue Slots Busy", "Issued Warp Per Scheduler",
        "No Eligible", "Active Warps Per Scheduler", "Eligible Warps Per Scheduler", "Warp Cycles Per Issued Instruction",
        "Grid Size", "Block Size", "Waves Per SM", "Dynamic Shared Memory Per Block", "Static Shared Memory Per Block",
        "L2 Hit Rate", "Mem Busy", "Max Bandwidth", "stalled")
STALLS = ("long_scoreboard", "short_scoreboard", "wait", "barrier", "math_pipe_throttle", "mio_throttle",
          "lg_throttle", "not_selected", "selected", "dispatch_stall", "no_instruction", "membar", "drain",
          "branch_resolving", "tex_throttle", "imc_miss", "sleeping")
STALL_METRICS = ",".join(f"smsp__average_warps_issue_stalled_{s}_per_issue_active.ratio" for s in STALLS)


def run_case(name: str, reps: int = 10) -> None:
    if name.startswith("w4a16"):
        from salactl.runtime.ops.w4a16.layout import pack_tc
        from salactl.runtime.ops.w4a16.triton import w4a16_linear

        N = 16384 if name == "w4a16_gateup" else 4096
        K = 4096
        q = pack_tc(torch.randint(0, 16, (K, N), dtype=torch.int32, device="cuda"))
        s = (torch.rand(K // 128, N, device="cuda") * 2e-3 + 1e-3).half()
        x = torch.randn(1, K, device="cuda").bfloat16()
        for _ in range(reps):
            w4a16_linear(x, q, s, 128)
    elif name.startswith("attn"):
        from decode_attention_bench import Case
        from salactl.runtime.ops.decode_attention.config import DEFAULT_CONFIGS

        case = Case("128K b1", 131072, 1, seed=2)
        dt, cfg = ("fp8_e4m3", DEFAULT_CONFIGS["fp8"]) if name == "attn_fp8" else ("bf16", DEFAULT_CONFIGS["bf16"])
        for _ in range(reps):
            case.call(dt, cfg)
    elif name.startswith("sel"):            # decode selection of one sala-9b layer, batch 1
        from salactl.runtime.ops.selection.gpu import select_decode
        from salactl.runtime.presets import sala_9b
        from sparse_decode_bench import one_row_keys

        cfg = sala_9b()
        ctx = (1 << 20) + 100 if name.endswith("1m") else (1 << 17) + 100
        pt, _, k1p, _ = one_row_keys(cfg, ctx)
        sc = cfg.sparse_config
        q = torch.randn(1, cfg.num_attention_heads, cfg.head_dim, device="cuda", dtype=torch.bfloat16)
        one = torch.zeros(1, dtype=torch.int32, device="cuda")
        seq = torch.tensor([ctx], dtype=torch.int32, device="cuda")
        for _ in range(reps):
            select_decode(q, k1p, pt, one, seq, sc, pt.shape[1])
    elif name == "skinny_o32":
        from salactl.runtime.ops.gemv.triton import linear

        w = torch.randn(4096, 4096, device="cuda").bfloat16()
        x = torch.randn(32, 4096, device="cuda").bfloat16()
        for _ in range(reps):
            linear(x, w)
    torch.cuda.synchronize()


def profile(name: str, ncu: str, out: Path) -> list[tuple[str, str, str]]:
    cmd = [ncu, "--target-processes", "all", "--kernel-name", f"regex:{KERNELS[name]}", "--launch-skip", "4",
           "--launch-count", "1", "--csv", "--page", "details"]
    for sec in SECTIONS:
        cmd += ["--section", sec]
    cmd += ["--metrics", STALL_METRICS]
    cmd += [sys.executable, __file__, "--run", name]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
    (out / f"ncu_{name}.csv").write_text(r.stdout + "\n" + r.stderr[-4000:])
    rows = []
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith('"')]
    for rec in csv.DictReader(io.StringIO("\n".join(lines))):
        metric = rec.get("Metric Name", "")
        if any(k in metric for k in KEEP):
            rows.append((rec.get("Section Name", ""), metric, f"{rec.get('Metric Value', '')} {rec.get('Metric Unit', '')}"))
    if not rows:
        rows.append(("error", f"ncu rc {r.returncode}", r.stderr[-300:].replace("\n", " ")))
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", default=",".join(KERNELS))
    ap.add_argument("--run", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    if args.run:
        run_case(args.run)
        return
    unknown = [c for c in args.cases.split(",") if c not in KERNELS]
    if unknown:
        raise SystemExit(f"ncu_kernels.py: unknown --cases {', '.join(unknown)}; known: {', '.join(KERNELS)}")
    from salactl.profiling.ncu_runner import find_ncu

    ncu = find_ncu(None)
    out = Path(args.out or os.environ.get("OUT", "out"))
    out.mkdir(parents=True, exist_ok=True)
    for name in args.cases.split(","):
        print(f"\n== {name} ({KERNELS[name]})", flush=True)
        for sec, metric, val in profile(name, ncu, out):
            print(f"  {sec[:22]:22s} {metric[:58]:58s} {val}")


if __name__ == "__main__":
    main()

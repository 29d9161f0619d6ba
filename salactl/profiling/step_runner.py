"""Run the warm-up and profiled steps with ranges open, and describe what was run (the manifest
that the table joins with: analytic costs per op, shapes, device).

`python -m salactl.profiling.step_runner SPEC.json MANIFEST.json` is the process Nsight Compute
launches: warm-up steps run outside any range, so `--nvtx-include "<phase>/"` sees only the
profiled step."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import torch

from salactl.profiling.ranges import RangeTimer, make_ranges
from salactl.profiling.spec import ProfileSpec
from salactl.profiling.workload import Workload, build
from salactl.quant.in_memory import quantized_as
from salactl.reports.atomic import write_atomic
from salactl.runtime.device_sync import synchronize


def run_phases(w: Workload, range_kind: str) -> dict[str, float]:
    """Returns the wall seconds of each profiled step (host clock around a synchronised step).
    Only the forward call sits inside the phase range; ids and batch metadata are built before."""
    ranges = make_ranges(range_kind)
    timer = RangeTimer(ranges)
    seconds = {}
    for phase in w.spec.phases:
        for _ in range(w.spec.warmup):
            w.step(phase)
        prepared = w.prepare(phase, timer)
        synchronize(w.device)
        handles = w.layer_ranges(ranges)
        try:
            t0 = time.perf_counter()
            ranges.push(phase)
            try:
                w.forward(prepared)
                synchronize(w.device)
            finally:
                ranges.pop()
            seconds[phase] = time.perf_counter() - t0
        finally:
            for h in handles:
                h.remove()
    return seconds


def describe(w: Workload, step_seconds: dict[str, float]) -> dict:
    from salactl.runtime.peaks import device_name

    peak_mem = torch.cuda.max_memory_allocated(w.device) if w.device.type == "cuda" else None
    steps = {}
    for p in w.spec.phases:
        new, cached = w.spec.step_rows(p)
        steps[p] = {"new_tokens": new, "cached_tokens": cached, "batch": w.spec.batch,
                    "scopes": list(w.spec.scopes) if w.spec.scopes else None,
                    "analytic": w.analytic(p), "analytic_by_scope": w.scoped_analytic(p),
                    "wall_s": step_seconds.get(p)}
    return {
        "spec": w.spec.to_dict(),
        "source": w.source,
        "device": str(w.device),
        "device_name": device_name(w.device),
        "dtype": str(w.dtype).replace("torch.", ""),
        "kv_dtype": w.spec.kv_cache_dtype if w.kv_bytes == 1 else str(w.dtype).replace("torch.", ""),
        "weights": quantized_as(w.model) or str(w.dtype).replace("torch.", ""),    # as run/bench/sweep name it
        "backend": w.backend_name,
        "config": w.config.to_hf_dict(),
        "steps": steps,
        "peak_memory_bytes": peak_mem,
        "torch": torch.__version__,
    }


def write_json(path: Path, obj) -> None:
    write_atomic(path, json.dumps(obj, indent=2, default=str))


def main(argv: list[str]) -> int:
    spec_path, manifest_path = argv
    w = build(ProfileSpec.read(Path(spec_path)))
    seconds = run_phases(w, "nvtx" if w.device.type == "cuda" else "record_function")
    write_json(Path(manifest_path), describe(w, seconds))
    return 0


if __name__ == "__main__":
    from salactl.errors import SalactlError

    try:
        sys.exit(main(sys.argv[1:]))
    except SalactlError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(e.exit_code)

"""Counter-free profiling with torch.profiler: kernel times from CUPTI (CUDA) or the host times
of the leaf aten ops (CPU), attributed to ops/layers through record_function ranges; bytes come
from the analytic model. Also writes a Chrome trace."""

from __future__ import annotations

import os
from pathlib import Path

from torch.profiler import ProfilerActivity, profile

from salactl.profiling.step_runner import run_phases
from salactl.profiling.workload import Workload
from salactl.reports.profile_table import KernelSample, attribute


def _stack(evt) -> list[str]:
    names = []
    e = evt
    while e is not None:
        names.append(e.name)
        e = e.cpu_parent
    return names[::-1]


def samples_from_events(events, cuda: bool) -> list[KernelSample]:
    out = []
    for e in events:
        if cuda:
            for k in getattr(e, "kernels", []) or []:
                phase, layer, op = attribute(_stack(e))
                if phase:
                    out.append(KernelSample(k.name, phase, layer, op, k.duration / 1e6))
        elif not e.cpu_children and e.name.startswith("aten::"):
            phase, layer, op = attribute(_stack(e))
            if phase:
                out.append(KernelSample(e.name, phase, layer, op, e.self_cpu_time_total / 1e6))
    return out


def profile_torch(w: Workload, trace_path: Path | None) -> tuple[list[KernelSample], dict[str, float]]:
    cuda = w.device.type == "cuda"
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=acts) as prof:
        seconds = run_phases(w, "record_function")
    samples = samples_from_events(prof.events(), cuda)
    if trace_path is not None:
        tmp = trace_path.with_name(f".{trace_path.name}.tmp{os.getpid()}")
        prof.export_chrome_trace(str(tmp))
        os.replace(tmp, trace_path)
    return samples, seconds

"""Counter-free profiling with torch.profiler: kernel times from CUPTI (CUDA) or the host self
times of the aten ops (CPU: each op's time less its child ops', so nested ops count once),
attributed to ops/layers through record_function ranges; bytes come
from the analytic model. Also writes a Chrome trace."""

from __future__ import annotations

import os
import re
from pathlib import Path

from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile

from salactl.errors import OutputWriteError
from salactl.profiling.step_runner import run_phases
from salactl.profiling.workload import Workload
from salactl.reports.atomic import atomic_path
from salactl.reports.profile_table import KernelSample, attribute


def _stack(evt) -> list[str]:
    names = []
    e = evt
    while e is not None:
        names.append(e.name)
        e = e.cpu_parent
    return names[::-1]


def _launch_events(events) -> dict:
    """Host-side launch calls (cudaLaunchKernel, cuLaunchKernelEx, cudaMemcpyAsync, ...) by
    correlation id: a device event carries the id of the call that launched it."""
    out = {}
    for e in events:
        if e.device_type == DeviceType.CPU and e.name.startswith("cu"):
            if e.id not in out or ("Launch" in e.name or "Mem" in e.name):
                out[e.id] = e
    return out


def samples_from_events(events, cuda: bool) -> list[KernelSample]:
    out = []
    if cuda:
        # Attributed through the launching call's parent ranges, not FunctionEvent.kernels: the
        # profiler links kernels only to an enclosing aten op, and Triton kernels have none.
        launches = _launch_events(events)
        for e in events:
            launch = launches.get(e.id) if e.device_type == DeviceType.CUDA else None
            if launch is None:          # host events, and the ranges' own GPU annotation spans
                continue
            phase, layer, op = attribute(_stack(launch))
            if phase:
                out.append(KernelSample(e.name, phase, layer, op, (e.time_range.end - e.time_range.start) / 1e6))
        return out
    # self time of every aten op, not only of leaves: aten::mm does its GEMM itself but has child
    # ops (aten::resolve_conj), so leaves alone would drop every matmul
    for e in events:
        if e.name.startswith("aten::"):
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
        with atomic_path(trace_path) as tmp:
            prof.export_chrome_trace(str(tmp))
            # torch logs a failed write (a full disk) and returns as if it had written the file
            if not tmp.is_file() or tmp.stat().st_size == 0:
                raise OutputWriteError("torch.profiler could not write its Chrome trace (disk full?)")
            drop_trace_name(tmp)
    return samples, seconds


# the last key of torch's Chrome trace: `],"traceName": "<the file name it was given>" }`
_TRACE_NAME = re.compile(rb',\s*"traceName":\s*".*"\s*}\s*$', re.DOTALL)
_TAIL_BYTES = 3 * 4096          # the key, the closing brace and a path of up to PATH_MAX


def drop_trace_name(path: Path) -> None:
    """Remove the "traceName" key from the trace torch wrote in `path`: it names that temporary file,
    gone once renamed, and the profile's final path is not known here (the whole profile is staged
    and moved at the end, and may be moved again); trace viewers do not read it. torch writes it
    last, so only the file's tail is read and cut: a trace of gigabytes is never loaded. A tail
    without it (another torch's layout) is left as written rather than risk the file."""
    with open(path, "r+b") as f:
        start = max(f.seek(0, os.SEEK_END) - _TAIL_BYTES, 0)
        f.seek(start)
        tail = f.read()
        comma = tail.rfind(b",", 0, max(tail.rfind(b'"traceName":'), 0))
        found = _TRACE_NAME.match(tail, comma) if comma >= 0 else None
        if found:
            f.seek(start + found.start())
            f.write(b"}")
            f.truncate()

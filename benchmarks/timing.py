"""GPU timing for the benchmark scripts: CUDA events around calls, and CUDA-graph replays of many
calls (launch overhead amortised as in the engine's graph decode). Medians throughout."""

from __future__ import annotations

import statistics

import torch


def events_time(fn, reps: int = 20, warm: int = 3) -> float:
    """Median seconds of fn() by CUDA events."""
    for _ in range(warm):
        fn()
    ts = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        ts.append(a.elapsed_time(b) / 1e3)
    return statistics.median(ts)


def graph_time(fn, inner: int = 10, reps: int = 10, flush=None) -> float:
    """Median seconds per fn() from replays of a CUDA graph of `inner` calls, each after flush()
    when given (subtract graph_time(flush) for the call alone)."""
    def body():
        if flush is not None:
            flush()
        fn()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        body()
        body()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(inner):
            body()
    return events_time(g.replay, reps) / inner


def kernel_times(fn, reps: int = 20, warm: int = 3) -> dict[str, float]:
    """Mean device microseconds per fn() of each kernel it launches (torch.profiler, eager calls):
    where a multi-kernel op spends its time."""
    from torch.profiler import ProfilerActivity, profile

    for _ in range(warm):
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            fn()
        torch.cuda.synchronize()
    out: dict[str, float] = {}
    for ev in prof.events():
        if ev.device_type == torch.autograd.DeviceType.CUDA:
            out[ev.name] = out.get(ev.name, 0.0) + ev.device_time / reps
    return out

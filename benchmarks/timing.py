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


def kernel_breakdown(graph, reps=5, top=14) -> dict:
    """GPU time per replay by kernel name (torch.profiler sees the kernels inside a graph)."""
    from collections import defaultdict

    from torch.profiler import ProfilerActivity, profile

    graph.replay()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            graph.replay()
        torch.cuda.synchronize()
    per = defaultdict(lambda: [0.0, 0])
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            per[e.name][0] += e.device_time / reps
            per[e.name][1] += 1 / reps
    total = sum(v[0] for v in per.values())
    rows = sorted(per.items(), key=lambda kv: -kv[1][0])
    return {"kernel_us_per_step": total, "kernels_per_step": round(sum(v[1] for v in per.values())),
            "top": [(n[:70], round(v[0], 1), round(v[1])) for n, v in rows[:top]]}

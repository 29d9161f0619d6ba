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


def _captured(calls: list) -> torch.cuda.CUDAGraph:
    """A CUDA graph of `calls` back to back, each distinct call warmed twice on a side stream first."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):
            for c in dict.fromkeys(calls):
                c()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for c in calls:
            c()
    return g


def graph_time(fn, inner: int = 10, reps: int = 10, flush=None) -> float:
    """Median seconds per fn() from replays of a CUDA graph of `inner` calls, each after flush()
    when given (subtract graph_time(flush) for the call alone)."""
    def body():
        if flush is not None:
            flush()
        fn()
    return events_time(_captured([body] * inner).replay, reps) / inner


def _per_kernel(fn, reps: int, warm: int) -> dict[str, list[float]]:
    """{kernel name: [device us, launches]} per fn() call, from torch.profiler (it also sees the
    kernels inside a replayed CUDA graph)."""
    from torch.profiler import ProfilerActivity, profile

    for _ in range(warm):
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            fn()
        torch.cuda.synchronize()
    per: dict[str, list[float]] = {}
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            v = per.setdefault(e.name, [0.0, 0.0])
            v[0] += e.device_time / reps
            v[1] += 1 / reps
    return per


def kernel_times(fn, reps: int = 20, warm: int = 3) -> dict[str, float]:
    """Mean device microseconds per fn() of each kernel it launches (eager calls): where a
    multi-kernel op spends its time."""
    return {name: v[0] for name, v in _per_kernel(fn, reps, warm).items()}


def kernel_breakdown(graph, reps=5, top=14) -> dict:
    """GPU time per replay of a CUDA graph by kernel name: total, kernel count, the top rows."""
    per = _per_kernel(graph.replay, reps, warm=1)
    rows = sorted(per.items(), key=lambda kv: -kv[1][0])
    return {"kernel_us_per_step": sum(v[0] for v in per.values()),
            "kernels_per_step": round(sum(v[1] for v in per.values())),
            "top": [(n[:70], round(v[0], 1), round(v[1])) for n, v in rows[:top]]}


def graph_time_us(calls: list, replays: int = 7) -> float:
    """Median time per call (µs) of `calls` captured back to back in one CUDA graph."""
    return events_time(_captured(calls).replay, reps=replays) * 1e6 / len(calls)

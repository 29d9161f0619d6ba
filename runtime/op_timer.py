"""Per-op-class wall time accounting for the roofline table. On CUDA it records events (no sync
per op); on CPU it reads the host clock. The null timer costs one dict lookup-free call."""

from __future__ import annotations

import time
from collections import defaultdict
from contextlib import contextmanager, nullcontext

import torch

_NULL = nullcontext()


def NULL_TIMER(name: str):  # noqa: N802 - used like a timer object
    return _NULL


class OpTimer:
    def __init__(self, device):
        self.device = torch.device(device)
        self.cuda = self.device.type == "cuda"
        self.seconds: dict[str, float] = defaultdict(float)
        self._events: list[tuple[str, object, object]] = []

    @contextmanager
    def __call__(self, name: str):
        if self.cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            yield
            end.record()
            self._events.append((name, start, end))
        else:
            t0 = time.perf_counter()
            yield
            self.seconds[name] += time.perf_counter() - t0

    def totals(self) -> dict[str, float]:
        if self._events:
            torch.cuda.synchronize(self.device)
            for name, s, e in self._events:
                self.seconds[name] += s.elapsed_time(e) / 1e3
            self._events.clear()
        return dict(self.seconds)

    def reset(self) -> None:
        self.totals()
        self.seconds.clear()

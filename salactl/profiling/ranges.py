"""Named ranges around the model's ops and layers, for profilers to attribute kernels.

The layers already call `batch.timer(op_class)` around qkv/attention/gla/gates/o_proj/mlp/lm_head;
`RangeTimer` is a drop-in timer object that opens a profiler range instead of timing. Per-layer
ranges come from forward pre/post hooks on `model.model.layers`, so no layer code changes.
Range names: the phase ("prefill"/"decode"), then "layer<i>", then the op class."""

from __future__ import annotations

from contextlib import contextmanager

import torch

LAYER_PREFIX = "layer"


class _Nvtx:
    def push(self, name: str) -> None:
        torch.cuda.nvtx.range_push(name)

    def pop(self) -> None:
        torch.cuda.nvtx.range_pop()


class _RecordFunction:
    """torch.profiler ranges (works on CPU too); kept on a stack because hooks open and close
    them in separate calls."""

    def __init__(self) -> None:
        self._open: list = []

    def push(self, name: str) -> None:
        rf = torch.profiler.record_function(name)
        rf.__enter__()
        self._open.append(rf)

    def pop(self) -> None:
        self._open.pop().__exit__(None, None, None)


def make_ranges(kind: str):
    if kind == "nvtx":
        return _Nvtx()
    if kind == "record_function":
        return _RecordFunction()
    raise ValueError(f"unknown range kind {kind!r}")


class RangeTimer:
    """`timer(name)` context manager that pushes/pops a range named `name`."""

    def __init__(self, ranges) -> None:
        self.ranges = ranges

    @contextmanager
    def __call__(self, name: str):
        self.ranges.push(name)
        try:
            yield
        finally:
            self.ranges.pop()

    def totals(self) -> dict[str, float]:   # OpTimer interface; ranges carry no times
        return {}

    def reset(self) -> None:
        pass


def add_layer_ranges(model, ranges) -> list:
    """Open "layer<i>" around every decoder layer; returns the hook handles (call .remove())."""
    handles = []
    for i, layer in enumerate(model.model.layers):
        name = f"{LAYER_PREFIX}{i}"
        handles.append(layer.register_forward_pre_hook(lambda m, a, n=name: ranges.push(n)))
        handles.append(layer.register_forward_hook(lambda m, a, o: ranges.pop()))
    return handles


def parse_layer(name: str) -> int | None:
    if name.startswith(LAYER_PREFIX) and name[len(LAYER_PREFIX):].isdigit():
        return int(name[len(LAYER_PREFIX):])
    return None

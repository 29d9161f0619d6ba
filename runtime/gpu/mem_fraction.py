"""The share of free GPU memory the GPU engine's caches take (`--mem-fraction`), kept free of torch
so that option checks (bench against an HTTP server among them) import nothing heavy."""

from __future__ import annotations

from salactl.errors import UsageError

DEFAULT_MEM_FRACTION = 0.9


def check_mem_fraction(mem_fraction: float) -> None:
    if not 0 < mem_fraction <= 1:
        raise UsageError(f"mem_fraction (--mem-fraction) must be in (0, 1] (a share of the free GPU memory), "
                         f"got {mem_fraction}")

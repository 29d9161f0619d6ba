"""The GPU engine's sizing options of bench and sweep (--max-running-requests, --mem-fraction),
None when not given: checked before anything loads, and refused on the reference engine, which
would ignore them. Free of torch, like the option checks of bench against an HTTP server."""

from __future__ import annotations

from salactl.errors import UsageError
from salactl.options import refuse_unused
from salactl.runtime.gpu.mem_fraction import DEFAULT_MEM_FRACTION, check_mem_fraction

DEFAULT_MAX_RUNNING = 64


def check_gpu_engine_values(max_running: int | None, mem_fraction: float | None) -> None:
    if max_running is not None and max_running < 1:
        raise UsageError(f"--max-running-requests must be positive, got {max_running}")
    if mem_fraction is not None:
        check_mem_fraction(mem_fraction)


def refuse_gpu_engine_options(engine_kind: str, max_running: int | None, mem_fraction: float | None) -> None:
    """On the reference engine (one sequence at a time, each request's cache grown as it goes)."""
    if engine_kind == "reference":
        refuse_unused([flag for flag, v in (("--max-running-requests", max_running), ("--mem-fraction", mem_fraction))
                       if v is not None],
                      "the GPU engine", "the reference engine serves one sequence at a time and grows its cache "
                      "as it goes: drop {it}, or use --engine gpu on CUDA", verb=("sizes", "size"))


def gpu_engine_sizes(max_running: int | None, mem_fraction: float | None) -> tuple[int, float]:
    """(max running requests, mem fraction) the GPU engine gets: the defaults for those not given."""
    return (DEFAULT_MAX_RUNNING if max_running is None else max_running,
            DEFAULT_MEM_FRACTION if mem_fraction is None else mem_fraction)

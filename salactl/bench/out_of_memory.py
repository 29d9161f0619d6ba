"""An allocation failure inside the embedded runtime is a capacity error (exit 11, with what to
lower), not the endpoint's failure (exit 8) nor a traceback."""

from __future__ import annotations

from contextlib import contextmanager

from salactl.bench.phase_checks import first_line
from salactl.errors import CapacityError


def is_out_of_memory(exc: BaseException | None) -> bool:
    """Python's MemoryError, or a torch allocator's RuntimeError: CUDA's OutOfMemoryError ("out of
    memory"), the CPU allocator's "can't allocate memory", safetensors' "unable to mmap ... Cannot
    allocate memory (12)" (ENOMEM)."""
    allocator = ("out of memory", "can't allocate memory", "Cannot allocate memory")
    return isinstance(exc, MemoryError) or (isinstance(exc, RuntimeError) and any(m in str(exc) for m in allocator))


def capacity_error(what: str, fix: str, exc: BaseException) -> CapacityError:
    return CapacityError(f"{what} ran out of memory ({first_line(f'{type(exc).__name__}: {exc}')}); {fix}")


@contextmanager
def out_of_memory_is_capacity(what: str, fix: str):
    try:
        yield
    except (MemoryError, RuntimeError) as e:
        if not is_out_of_memory(e):
            raise
        raise capacity_error(what, fix, e) from e

"""Human-readable sizes for messages. Free of rich and torch: library code (the loader's capacity
errors) uses it, and importing rich draws from Python's global `random` (rich.style seeds an id),
which a library must leave alone."""

from __future__ import annotations


def human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    return str(n)

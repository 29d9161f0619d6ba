"""Human-readable sizes for messages. Free of rich and torch: library code (the loader's capacity
errors) uses it, and importing rich draws from Python's global `random` (rich.style seeds an id),
which a library must leave alone."""

from __future__ import annotations


def fmt_float(v: float) -> str:
    """A measured number for a table: 4 significant digits, one decimal from 1,000 to 100,000
    (tok/s, TTFT in ms) and exponent notation outside 1e-3..1e5. The terminal tables and the report's
    markdown/CSV/HTML share it, so a number reads the same in both."""
    if v == 0:
        return "0"
    a = abs(v)
    return f"{v:.1f}" if 1000 <= a < 1e5 else f"{v:.4g}"


def human_bytes(n: float) -> str:
    """Binary units up to EiB; past 1024 EiB (a size no machine has) in three significant digits."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"):
        if abs(n) < 1024 or unit == "EiB":
            if unit == "B":
                return f"{int(n)} B"
            return f"{n:.1f} {unit}" if abs(n) < 1024 else f"{n:.3g} {unit}"
        n /= 1024
    return str(n)

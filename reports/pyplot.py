"""matplotlib.pyplot on the Agg backend for every plot salactl draws (bench, sweep and report alike),
or None with one warning line naming why: matplotlib (the optional `plots` extra) is missing, or fails
to import (a broken MPLCONFIGDIR or HOME raises RuntimeError/OSError there). Kept free of heavy imports
so that callers load pandas only if they need it."""

from __future__ import annotations

import functools

from salactl.output import warn_once


@functools.cache
def _pyplot_or_why():
    """(matplotlib.pyplot on the Agg backend, None) or (None, why not): tried once per process, as an
    import that failed half-way leaves part of matplotlib in sys.modules."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except Exception as e:      # not only ImportError: a broken MPLCONFIGDIR or HOME raises RuntimeError/OSError
        if isinstance(e, ModuleNotFoundError) and e.name == "matplotlib":
            return None, "matplotlib is missing (pip install 'salactl[plots]')"
        return None, f"matplotlib failed to import: {type(e).__name__}: {first_line(e)}"
    return plt, None


def pyplot():
    """matplotlib.pyplot, or None with one `warning: plots skipped: ...` line naming why."""
    plt, why = _pyplot_or_why()
    if plt is None:
        warn_once(f"plots skipped: {why}")
    return plt


def unavailable() -> str | None:
    """Why there is no pyplot (as pyplot()'s warning says it), or None."""
    return _pyplot_or_why()[1]


def first_line(what) -> str:
    return (str(what).strip().splitlines() or [""])[0]

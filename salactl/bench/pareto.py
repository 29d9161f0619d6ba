"""Pareto front of sweep points (both objectives minimized: a latency and an accuracy loss) and
its plot (matplotlib is the optional `plots` extra; without a working one the plot is skipped with a
warning line naming why)."""

from __future__ import annotations

from pathlib import Path

from salactl.reports.atomic import atomic_path
from salactl.reports.pyplot import pyplot
from salactl.reports.records import is_finite_number


def _usable(points: list[dict], x: str, y: str) -> list[dict]:
    """Records store NaN/inf as strings ("nan"), a bool is no measurement, and an integer past float's
    range (a --resume'd record edited by hand) none either."""
    return [p for p in points if is_finite_number(p.get(x)) and is_finite_number(p.get(y))]


def pareto_front(points: list[dict], x: str, y: str) -> list[dict]:
    """Points not dominated by any other (≤ in both, < in one); skips points without a finite x and y."""
    usable = _usable(points, x, y)
    front = []
    for p in usable:
        dominated = any(q is not p and q[x] <= p[x] and q[y] <= p[y] and (q[x] < p[x] or q[y] < p[y])
                        for q in usable)
        if not dominated:
            front.append(p)
    return sorted(front, key=lambda p: (p[x], p[y]))


def plot_front(points: list[dict], front: list[dict], x: str, y: str, path: Path) -> Path | None:
    """Scatter of every point with the front as a line; returns the path, or None without a working
    matplotlib."""
    plt = pyplot()
    if plt is None:
        return None
    usable = _usable(points, x, y)
    fig, ax = plt.subplots(figsize=(7, 4.5))
    ax.scatter([p[x] for p in usable], [p[y] for p in usable], color="#999999", label="points")
    ax.plot([p[x] for p in front], [p[y] for p in front], "o-", color="#c0392b", label="Pareto front")
    for p in front:
        ax.annotate(str(p.get("phase", "")), (p[x], p[y]), fontsize=7, xytext=(4, 4),
                    textcoords="offset points")
    ax.set_xlabel(x)
    ax.set_ylabel(y)
    if usable and min(p[y] for p in usable) > 0:
        ax.set_yscale("log")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    path = Path(path)
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=120)
    plt.close(fig)
    return path

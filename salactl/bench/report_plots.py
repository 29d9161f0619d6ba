"""Plots of a bench run, rendered from its saved files (matplotlib, the optional `plots` extra):
output throughput per phase (from the records), and with --details, latency CDFs (TTFT, TPOT,
E2E) and TTFT vs input length per phase (from the per-request CSV). Each PNG is written through a
temp file; without a working matplotlib nothing is drawn, with one warning line naming why."""

from __future__ import annotations

import csv
from pathlib import Path

from salactl.reports.atomic import atomic_path
from salactl.reports.pyplot import pyplot as _plt
from salactl.reports.text_cells import FORMULA_STARTS


def _save(plt, fig, path: Path) -> Path:
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=110)
    plt.close(fig)
    return path


def _phase(cell: str) -> str:
    """The phase's name from its CSV cell: csv_cell guards a name starting with - or + as '-name (a
    profile's phase names never start with ')."""
    return cell[1:] if cell.startswith("'") and cell[1:].startswith(FORMULA_STARTS) else cell


def read_details(path: Path) -> dict[str, list[dict]]:
    """Successful requests per phase: input_len, ttft_ms, tpot_ms, e2e_ms (floats, tpot may be None)."""
    by_phase: dict[str, list[dict]] = {}
    with open(path, newline="", encoding="utf-8") as f:
        for row in csv.DictReader(f):
            if row["success"] != "1":
                continue
            by_phase.setdefault(_phase(row["phase"]), []).append({
                "input_len": int(row["input_len"]), "ttft_ms": float(row["ttft_ms"]),
                "tpot_ms": float(row["tpot_ms"]) if row["tpot_ms"] else None, "e2e_ms": float(row["e2e_ms"])})
    return by_phase


def throughput_plot(records: list[dict], path: Path) -> Path | None:
    plt = _plt()
    if plt is None or not records:
        return None
    fig, ax = plt.subplots(figsize=(max(4, 1.2 * len(records)), 3.5))
    names = [r["phase"] for r in records]
    ax.bar(names, [r.get("output_throughput") or 0 for r in records], color="#2e86c1")
    ax.set_ylabel("output tok/s")
    ax.set_title("output throughput per phase")
    ax.grid(axis="y", alpha=0.3)
    return _save(plt, fig, path)


def cdf_plot(details: dict[str, list[dict]], path: Path) -> Path | None:
    plt = _plt()
    if plt is None or not details:
        return None
    fig, axes = plt.subplots(1, 3, figsize=(12, 3.5))
    for ax, key, title in zip(axes, ("ttft_ms", "tpot_ms", "e2e_ms"), ("TTFT", "TPOT", "E2E latency")):
        for phase, rows in details.items():
            vals = sorted(r[key] for r in rows if r[key] is not None)
            if vals:
                ax.step([vals[0]] + vals, [0.0] + [(i + 1) / len(vals) for i in range(len(vals))],
                        where="post", label=phase)
        ax.set_xlabel(f"{title} (ms)")
        ax.set_ylabel("fraction of requests")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    return _save(plt, fig, path)


def ttft_vs_input_plot(details: dict[str, list[dict]], path: Path) -> Path | None:
    plt = _plt()
    if plt is None or not details:
        return None
    fig, ax = plt.subplots(figsize=(6, 4))
    for phase, rows in details.items():
        ax.scatter([r["input_len"] for r in rows], [r["ttft_ms"] for r in rows], s=14, label=phase)
    ax.set_xlabel("input tokens")
    ax.set_ylabel("TTFT (ms)")
    ax.set_title("TTFT vs input length (queueing included)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return _save(plt, fig, path)

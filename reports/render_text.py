"""Markdown and CSV renderings of a LatencyReport (and any list of flat rows)."""

from __future__ import annotations

import pandas as pd

from salactl.reports.latency import LatencyReport
from salactl.reports.records import unit


def fmt(v) -> str:
    if v is None:
        return ""
    if isinstance(v, bool):
        return str(v).lower()
    if isinstance(v, float):
        if v == 0:
            return "0"
        a = abs(v)
        if a >= 1e5 or a < 1e-3:
            return f"{v:.4g}"
        return f"{v:.4g}" if a < 1000 else f"{v:.1f}"
    return str(v)


# key suffixes that already name the unit (mean_ttft_ms, floor_s, decode_tok_s, energy_j)
UNIT_SUFFIXES = ("_ms", "_s", "_bytes", "_j", "_w")


def header_name(col: str) -> str:
    u = unit(col) if not (col.startswith("knob.") or col.endswith(UNIT_SUFFIXES)) else ""
    return f"{col} ({u})" if u else col


def md_table(columns: list[str], rows: list[list]) -> str:
    def cell(v) -> str:
        return fmt(v).replace("|", "\\|")

    lines = ["| " + " | ".join(columns) + " |",
             "|" + "|".join("---" if i == 0 else "---:" for i in range(len(columns))) + "|"]
    lines += ["| " + " | ".join(cell(v) for v in r) + " |" for r in rows]
    return "\n".join(lines)


def _used_columns(report: LatencyReport, rows: list[dict]) -> list[str]:
    return [c for c in report.columns if any(r.get(c) not in (None, "") for r in rows)]


def markdown(report: LatencyReport, title: str = "Latency report") -> str:
    out = [f"# {title}", "", f"Runs: {', '.join(report.labels)}. Values as recorded; nothing is "
           "recomputed.", ""]
    for phase in report.phases:
        rows = [r for r in report.rows if str(r.get("phase")) == phase]
        cols = [c for c in _used_columns(report, rows) if c != "phase"]
        out += [f"## phase: {phase}", "", md_table([header_name(c) for c in cols],
                                                   [[r.get(c) for c in cols] for r in rows]), ""]
    if report.comparison:
        base = report.labels[0]
        out += [f"## side by side (relative to {base})", ""]
        cols = ["phase", "metric", *report.labels, *(f"{lb} / {base}" for lb in report.labels[1:])]
        rows = [[c["phase"], header_name(c["metric"]), *(c["values"][lb] for lb in report.labels),
                 *(c["relative"][lb] for lb in report.labels[1:])] for c in report.comparison]
        out += [md_table(cols, rows), ""]
    if report.env:
        out += ["## environment", ""]
        keys = sorted({k for e in report.env.values() for k in e})
        out += [md_table(["label", *keys], [[lb, *(e.get(k) for k in keys)]
                                            for lb, e in report.env.items()]), ""]
    return "\n".join(out)


def csv_text(report: LatencyReport) -> str:
    """Values as recorded: object columns (no float re-inference), booleans as the Markdown writes
    them (true/false), and a column whose values are all integers stays integer (nullable Int64)
    when some rows lack it."""
    rows = [{k: fmt(v) if isinstance(v, bool) else v for k, v in r.items()} for r in report.rows]
    table = pd.DataFrame(rows, columns=_used_columns(report, report.rows), dtype=object)
    for col in table.columns:
        vals = [v for v in table[col] if v is not None]
        if vals and all(isinstance(v, int) and not isinstance(v, bool) and -2**63 <= v < 2**63
                        for v in vals):
            table[col] = table[col].astype("Int64")
    return table.to_csv(index=False)

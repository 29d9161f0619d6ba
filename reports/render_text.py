"""Markdown and CSV renderings of a LatencyReport (and any list of flat rows)."""

from __future__ import annotations

import json

import pandas as pd

from salactl.reports.latency import ENV_KEYS, LatencyReport, SweepTable
from salactl.reports.records import unit
from salactl.reports.text_cells import csv_cell, lf_records, md_text
from salactl.units import fmt_float


def fmt(v) -> str:
    if v is None:
        return ""
    if isinstance(v, bool):
        return str(v).lower()
    if isinstance(v, (dict, list)):             # nested knobs (knob.target, knob.dataset)
        return compact_json(v)
    if isinstance(v, float):
        return fmt_float(v)
    return str(v)


def compact_json(v) -> str:
    return json.dumps(v, separators=(",", ":"), default=str)


# key suffixes that already name the unit (mean_ttft_ms, floor_s, decode_tok_s, energy_j)
UNIT_SUFFIXES = ("_ms", "_s", "_bytes", "_j", "_w")


def header_name(col: str) -> str:
    u = unit(col) if not (col.startswith("knob.") or col.endswith(UNIT_SUFFIXES)) else ""
    return f"{col} ({u})" if u else col


def md_cell(v) -> str:
    return md_text(fmt(v)).replace("|", "\\|")


def md_table(columns: list[str], rows: list[list]) -> str:
    lines = ["| " + " | ".join(md_cell(c) for c in columns) + " |",
             "|" + "|".join("---" if i == 0 else "---:" for i in range(len(columns))) + "|"]
    lines += ["| " + " | ".join(md_cell(v) for v in r) + " |" for r in rows]
    return "\n".join(lines)


def _used_columns(report: LatencyReport, rows: list[dict]) -> list[str]:
    return [c for c in report.columns if any(r.get(c) not in (None, "") for r in rows)]


def markdown(report: LatencyReport, title: str = "Latency report") -> str:
    out = [f"# {md_text(title)}", "", md_text(f"Runs: {', '.join(report.labels)}. Values as recorded; nothing "
                                               "is recomputed."), ""]
    for phase in report.phases:
        rows = report.phase_rows(phase)
        cols = [c for c in _used_columns(report, rows) if c != "phase"]
        out += [f"## phase: {md_text(phase)}", "", md_table([header_name(c) for c in cols],
                                                            [[r.get(c) for c in cols] for r in rows]), ""]
    for sweep in report.sweeps:
        out += [f"## sweep: {md_text(sweep.label)}", "", md_text(sweep_caption(sweep)), "",
                md_table(*sweep_table(sweep)), ""]
    if report.comparison_runs or report.notes:
        out += ["## side by side", ""]
    for heading, cols, rows in comparison_tables(report):
        out += [f"### {md_text(heading)}", "", md_table(cols, rows), ""]
    out += [*(md_text(f"Note: {n}") for n in report.notes), *([""] if report.notes else [])]
    if report.env:
        out += ["## environment", "", md_table(*env_table(report)), ""]
    return "\n".join(out)


def sweep_caption(sweep: SweepTable) -> str:
    """What every point of the sweep shares (the heading names it already: a run_id as label too), and
    the row order."""
    shared = [f"{k} {fmt(v)}" for k, v in sweep.shared.items() if v not in (None, sweep.label)]
    order = f"sorted by {', '.join(sweep.knobs)}" if sweep.knobs else "no knob varies"
    return "; ".join([*shared, f"one row per point ({order})"])


def sweep_table(sweep: SweepTable) -> tuple[list[str], list[list]]:
    """Headers and cells of a sweep's table; its phase column is the point, as `salactl sweep` names it."""
    headers = ["point" if c == "phase" else header_name(c) for c in sweep.columns]
    return headers, [[r.get(c) for c in sweep.columns] for r in sweep.rows]


def comparison_tables(report: LatencyReport) -> list[tuple[str, list[str], list[list]]]:
    """(heading, columns, rows) per compared phase: the runs' target and model, then each metric
    per label and relative to the phase's first label; the heading names runs with failed requests."""
    tables = []
    for phase, runs in report.comparison_runs.items():
        labels = list(runs)
        base = labels[0]
        failed = [f"{lb} {fmt(r['failed'])}" for lb, r in runs.items()
                  if isinstance(r.get("failed"), (int, float)) and r["failed"] > 0]
        heading = f"phase {phase} (relative to {base})" + (
            f"; failed requests: {', '.join(failed)}" if failed else "")
        blank = [None] * (len(labels) - 1)
        rows = [[key, *(runs[lb].get(key) for lb in labels), *blank] for key in ("target", "model")]
        rows += [[header_name(c["metric"]), *(c["values"][lb] for lb in labels),
                  *(c["relative"][lb] for lb in labels[1:])]
                 for c in report.comparison if c["phase"] == phase]
        tables.append((heading, ["metric", *labels, *(f"{lb} / {base}" for lb in labels[1:])], rows))
    return tables


def env_table(report: LatencyReport) -> tuple[list[str], list[list]]:
    keys = [k for k in ENV_KEYS if any(k in e for e in report.env)]
    rows = [[e["label"], *(e.get(k) for k in keys), e["phases"]] for e in report.env]
    return ["label", *keys, "phases"], rows


def csv_text(report: LatencyReport) -> str:
    """Values as recorded: object columns (no float re-inference), booleans and nested knobs as the
    Markdown writes them (true/false, compact JSON), and a column whose values are all integers
    stays integer (nullable Int64) when some rows lack it."""
    rows = [{k: csv_cell(fmt(v) if isinstance(v, (bool, dict, list)) else v) for k, v in r.items()}
            for r in report.rows]
    table = pd.DataFrame(rows, columns=_used_columns(report, report.rows), dtype=object)
    for col in table.columns:
        vals = [v for v in table[col] if v is not None]
        if vals and all(isinstance(v, int) and not isinstance(v, bool) and -2**63 <= v < 2**63
                        for v in vals):
            table[col] = table[col].astype("Int64")
    return lf_records(table.to_csv(index=False, lineterminator="\r\n"))

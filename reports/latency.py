"""The latency report model: bench/sweep/run records side by side, grouped by label.

It only arranges what the records carry (known metric columns that are present, the knobs that
vary between records); nothing is recomputed from raw data. Renderers: reports/render_text.py
(Markdown, CSV) and reports/render_html.py (self-contained HTML with plots). The records become
one pandas table (a column per identity field, knob and metric), which finds the varying knobs
and orders the rows."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import pandas as pd

from salactl.reports.records import IDENTITY, first_items, group_by_label, label_of, present_metrics

IDENTITY_COLUMNS = ("label", "kind", "profile", "phase", "target", "model", "run_id")


@dataclass
class LatencyReport:
    labels: list[str]
    phases: list[str]
    metrics: list[str]
    knobs: list[str]                     # knobs whose value differs between records
    rows: list[dict]                     # one per record: identity, knob.<name>, metrics
    comparison: list[dict] = field(default_factory=list)   # metric × label, per phase
    comparison_runs: dict = field(default_factory=dict)    # phase -> label -> target, model, failed
    env: list[dict] = field(default_factory=list)          # one row per distinct environment of a label
    notes: list[str] = field(default_factory=list)         # what side by side leaves out, and why

    @property
    def columns(self) -> list[str]:
        return [*IDENTITY_COLUMNS, *(f"knob.{k}" for k in self.knobs), *self.metrics]

    def to_dict(self) -> dict:
        return {"labels": self.labels, "phases": self.phases, "metrics": self.metrics,
                "knobs": self.knobs, "columns": self.columns, "rows": self.rows,
                "comparison": self.comparison, "comparison_runs": self.comparison_runs,
                "env": self.env, "notes": self.notes}


def _sort_key(value):
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return (0, value, "")
    return (1, 0, str(value))


def record_table(records: list[dict], metrics: list[str]) -> pd.DataFrame:
    """One row per record: identity fields, `knob.<name>` for every knob any record has, the metrics
    (object columns: values stay as recorded, absent ones None)."""
    table = pd.DataFrame([{**{c: r.get(c) for c in IDENTITY}, "label": label_of(r),
                           **{f"knob.{k}": v for k, v in (r.get("knobs") or {}).items()},
                           **{m: r.get(m) for m in metrics}} for r in records], dtype=object)
    return table.where(table.notna(), None)


def build(records: list[dict]) -> LatencyReport:
    groups = group_by_label(records)
    metrics = present_metrics(records)
    phases = list(dict.fromkeys(r["phase"] for r in records))
    table = record_table(records, metrics)
    knob_cols = [c for c in table.columns if c.startswith("knob.") and table[c].map(repr).nunique() > 1]
    labels, phase_at = list(groups), {p: i for i, p in enumerate(phases)}
    order = {"label": lambda s: s.map(labels.index), "phase": lambda s: s.map(phase_at)}
    table = table.sort_values(["label", "phase", *knob_cols], kind="stable",
                              key=lambda s: order[s.name](s) if s.name in order else s.map(_sort_key))
    columns = [*(c for c in IDENTITY if c != "label"), "label", *knob_cols, *metrics]
    rows = table[columns].to_dict("records")
    knobs = [c.removeprefix("knob.") for c in knob_cols]
    report = LatencyReport(labels, phases, metrics, knobs, rows, env=environments(groups))
    report.comparison, report.comparison_runs, report.notes = _comparison(groups, phases, metrics)
    return report


ENV_KEYS = ("gpu", "cpu", "git_sha", "git_dirty", "salactl", "torch", "triton", "cuda", "driver")


def environments(groups: dict[str, list[dict]]) -> list[dict]:
    """One row per distinct environment within each label (a label may span commits, versions or
    machines), with the phases recorded in it."""
    rows = []
    for label, recs in groups.items():
        envs: dict[str, tuple[dict, list[str]]] = {}
        for r in recs:
            recorded = r.get("env") or {}
            env = {k: recorded[k] for k in ENV_KEYS if recorded.get(k) is not None}
            envs.setdefault(json.dumps(env, sort_keys=True, default=str), (env, []))[1].append(r["phase"])
        rows += [{"label": label, **env, "phases": ", ".join(dict.fromkeys(phases))}
                 for env, phases in envs.values()]
    return rows


def _comparison(groups: dict[str, list[dict]], phases: list[str],
                metrics: list[str]) -> tuple[list[dict], dict, list[str]]:
    """Per phase, metric × label for the labels with exactly one record in it, each relative to the
    phase's first such label; the compared runs' target, model and failed count (runs of different
    targets or models, or with failures, are not like for like); and one note on what was left out."""
    out, runs, left_out = [], {}, []
    if len(groups) < 2:
        return out, runs, []
    for phase in phases:
        per_label = {lb: [r for r in recs if r["phase"] == phase] for lb, recs in groups.items()}
        present = {lb: rs for lb, rs in per_label.items() if rs}
        single = [lb for lb, rs in present.items() if len(rs) == 1]
        counts = {lb: f"{lb} ×{len(rs)}" for lb, rs in present.items()}
        if len(single) < 2:
            left_out.append(f"phase {phase} ({', '.join(counts.values())})")
            continue
        if len(single) < len(present):
            several = ", ".join(c for lb, c in counts.items() if lb not in single)
            left_out.append(f"{several} in phase {phase}")
        runs[phase] = {lb: {k: present[lb][0].get(k) for k in ("target", "model", "failed")} for lb in single}
        base = single[0]
        for m in metrics:
            vals = {lb: present[lb][0].get(m) for lb in single}
            if all(not isinstance(v, (int, float)) for v in vals.values()):
                continue
            b = vals[base]
            rel = {lb: (v / b if isinstance(v, (int, float)) and isinstance(b, (int, float)) and b else None)
                   for lb, v in vals.items()}
            out.append({"phase": phase, "metric": m, "base": base, "values": vals, "relative": rel})
    notes = []
    if left_out:
        what = "no side-by-side table" if not runs else "not side by side"
        notes.append(f"{what}: {first_items(left_out)}; a label is compared where it has one record in "
                     "a phase that another label also has once")
    return out, runs, notes

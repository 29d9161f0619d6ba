"""The latency report model: bench/sweep/run records side by side, grouped by label.

It only arranges what the records carry (known metric columns that are present, the knobs that
vary between records); nothing is recomputed from raw data. Renderers: reports/render_text.py
(Markdown, CSV) and reports/render_html.py (self-contained HTML with plots). The records become
one pandas table (a column per identity field, knob and metric), which finds the varying knobs
and orders the rows."""

from __future__ import annotations

from dataclasses import dataclass, field

import pandas as pd

from salactl.reports.records import IDENTITY, group_by_label, label_of, present_metrics

IDENTITY_COLUMNS = ("label", "kind", "profile", "phase", "target", "model", "run_id")


@dataclass
class LatencyReport:
    labels: list[str]
    phases: list[str]
    metrics: list[str]
    knobs: list[str]                     # knobs whose value differs between records
    rows: list[dict]                     # one per record: identity, knob.<name>, metrics
    comparison: list[dict] = field(default_factory=list)   # metric × label, per phase
    env: dict = field(default_factory=dict)                # label -> short environment

    @property
    def columns(self) -> list[str]:
        return [*IDENTITY_COLUMNS, *(f"knob.{k}" for k in self.knobs), *self.metrics]

    def to_dict(self) -> dict:
        return {"labels": self.labels, "phases": self.phases, "metrics": self.metrics,
                "knobs": self.knobs, "columns": self.columns, "rows": self.rows,
                "comparison": self.comparison, "env": self.env}


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
    phases = list(dict.fromkeys(str(r.get("phase")) for r in records))
    table = record_table(records, metrics)
    knob_cols = [c for c in table.columns if c.startswith("knob.") and table[c].map(repr).nunique() > 1]
    labels, phase_at = list(groups), {p: i for i, p in enumerate(phases)}
    order = {"label": lambda s: s.map(labels.index), "phase": lambda s: s.map(lambda p: phase_at[str(p)])}
    table = table.sort_values(["label", "phase", *knob_cols], kind="stable",
                              key=lambda s: order[s.name](s) if s.name in order else s.map(_sort_key))
    columns = [*(c for c in IDENTITY if c != "label"), "label", *knob_cols, *metrics]
    rows = table[columns].to_dict("records")
    knobs = [c.removeprefix("knob.") for c in knob_cols]
    env = {label: _short_env(recs[0].get("env") or {}) for label, recs in groups.items()}
    report = LatencyReport(labels, phases, metrics, knobs, rows, env=env)
    report.comparison = _comparison(groups, phases, metrics)
    return report


def _short_env(env: dict) -> dict:
    keys = ("gpu", "git_sha", "git_dirty", "salactl", "torch", "cuda", "driver")
    return {k: env.get(k) for k in keys if env.get(k) is not None}


def _comparison(groups: dict[str, list[dict]], phases: list[str], metrics: list[str]) -> list[dict]:
    """metric × label per phase, when every label has exactly one record in that phase; the last
    column is each label's value relative to the first label's."""
    out = []
    labels = list(groups)
    if len(labels) < 2:
        return out
    for phase in phases:
        per_label = {lb: [r for r in groups[lb] if str(r.get("phase")) == phase] for lb in labels}
        if any(len(v) != 1 for v in per_label.values()):
            continue
        for m in metrics:
            vals = {lb: per_label[lb][0].get(m) for lb in labels}
            if all(not isinstance(v, (int, float)) for v in vals.values()):
                continue
            base = vals[labels[0]]
            rel = {lb: (v / base if isinstance(v, (int, float)) and isinstance(base, (int, float))
                        and base else None) for lb, v in vals.items()}
            out.append({"phase": phase, "metric": m, "values": vals, "relative": rel})
    return out


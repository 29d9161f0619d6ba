"""The latency report model: bench/sweep/run records side by side, grouped by label.

It only arranges what the records carry (known metric columns that are present, the knobs that
vary between records); nothing is recomputed from raw data. Renderers: reports/render_text.py
(Markdown, CSV) and reports/render_html.py (self-contained HTML with plots)."""

from __future__ import annotations

from dataclasses import dataclass, field

from salactl.reports.records import IDENTITY, group_by_label, present_metrics

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


def _varying_knobs(records: list[dict]) -> list[str]:
    names: list[str] = []
    for r in records:
        for k in (r.get("knobs") or {}):
            if k not in names:
                names.append(k)
    out = []
    for k in names:
        vals = {repr((r.get("knobs") or {}).get(k)) for r in records}
        if len(vals) > 1:
            out.append(k)
    return out


def _sort_key(value):
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return (0, value, "")
    return (1, 0, str(value))


def build(records: list[dict]) -> LatencyReport:
    groups = group_by_label(records)
    metrics = present_metrics(records)
    knobs = _varying_knobs(records)
    phases = list(dict.fromkeys(str(r.get("phase")) for r in records))
    rows = []
    for label, recs in groups.items():
        recs = sorted(recs, key=lambda r: (phases.index(str(r.get("phase"))),
                                           *[_sort_key((r.get("knobs") or {}).get(k)) for k in knobs]))
        for r in recs:
            row = {c: r.get(c) for c in IDENTITY if c != "label"}
            row["label"] = label
            for k in knobs:
                row[f"knob.{k}"] = (r.get("knobs") or {}).get(k)
            for m in metrics:
                row[m] = r.get(m)
            rows.append(row)
    env = {label: _short_env(recs[0].get("env") or {}) for label, recs in groups.items()}
    report = LatencyReport(list(groups), phases, metrics, knobs, rows, env=env)
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


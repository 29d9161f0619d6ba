"""The latency report model: bench/sweep/run records side by side, grouped by label.

It only arranges what the records carry (known metric columns that are present, the knobs that
vary between records); nothing is recomputed from raw data. Bench and run records are arranged
per phase; a sweep's records (one per grid point, each named by its phase) make one table per
sweep run, a row per point. Renderers: reports/render_text.py (Markdown, CSV) and
reports/render_html.py (self-contained HTML with plots). The records become one pandas table (a
column per identity field, knob and metric), which finds the varying knobs and orders the rows."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field

import pandas as pd

from salactl.bench.sweep_grid import LABEL_ABBR
from salactl.reports.records import IDENTITY, first_items, group_by_label, label_of, present_metrics

IDENTITY_COLUMNS = ("label", "kind", "profile", "phase", "target", "model", "run_id")
SWEEP = "sweep"
# `salactl sweep`'s own table (salactl/cmd_sweep.py), in its order: a sweep's table leads with these
SWEEP_LEAD_METRICS = ("failed", "mean_ttft_ms", "mean_tpot_ms", "output_throughput", "cache_bytes_per_request",
                      "peak_gpu_memory_bytes", "logit_kl_mean", "logit_kl_sparse_mean", "top1_agreement",
                      "passkey_accuracy")
# what names a sweep run besides its label: said once above its table when every point shares it
SWEEP_RUN_FIELDS = ("model", "target", "run_id")


@dataclass
class SweepTable:
    """One sweep run (the points of a label, else of a run_id; --resume adds run_ids to a label): a
    row per point, ordered by the knobs that vary between its points."""
    label: str
    shared: dict                         # SWEEP_RUN_FIELDS every point has the same value of
    knobs: list[str]                     # knobs that vary between its points, the sort keys in order
    columns: list[str]                   # "phase" (the point's name), run fields that vary, knob.<name> (those
                                         # that vary, then those that set the report's sweeps apart), metrics
    rows: list[dict]

    def to_dict(self) -> dict:
        return asdict(self)


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
    sweeps: list[SweepTable] = field(default_factory=list)  # sweep records; `phases` are bench/run ones

    @property
    def columns(self) -> list[str]:
        return [*IDENTITY_COLUMNS, *(f"knob.{k}" for k in self.knobs), *self.metrics]

    def phase_rows(self, phase: str) -> list[dict]:
        """The bench/run rows of a phase (a sweep point of the same name belongs to its sweep)."""
        return [r for r in self.rows if r["kind"] != SWEEP and str(r.get("phase")) == phase]

    def to_dict(self) -> dict:
        return {"labels": self.labels, "phases": self.phases, "metrics": self.metrics,
                "knobs": self.knobs, "columns": self.columns, "rows": self.rows,
                "sweeps": [t.to_dict() for t in self.sweeps],
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
    phased = [r for r in records if r["kind"] != SWEEP]
    phases = list(dict.fromkeys(r["phase"] for r in phased))
    table = record_table(records, metrics)
    knob_cols = [c for c in table.columns if c.startswith("knob.") and table[c].map(repr).nunique() > 1]
    labels, phase_at = list(groups), {p: i for i, p in enumerate(phases)}
    # within a label: its phases in order, then its sweep points, which only their knobs order
    sections = [len(phases) if kind == SWEEP else phase_at[phase]
                for kind, phase in zip(table["kind"], table["phase"])]
    # ordered in Python, not by sort_values: pandas < 3.1 re-infers a key column's dtype and raises
    # OverflowError on an int past float range (a knob of 10**400), which the report keeps exactly
    knob_values = zip(*(table[c].tolist() for c in knob_cols)) if knob_cols else ((),) * len(table)
    keys = [(labels.index(label), section, *map(_sort_key, knobs))
            for label, section, knobs in zip(table["label"], sections, knob_values)]
    table = table.iloc[sorted(range(len(table)), key=keys.__getitem__)]
    columns = [*(c for c in IDENTITY if c != "label"), "label", *knob_cols, *metrics]
    rows = table[columns].to_dict("records")
    knobs = [c.removeprefix("knob.") for c in knob_cols]
    report = LatencyReport(labels, phases, metrics, knobs, rows, env=environments(groups),
                           sweeps=sweep_tables([r for r in rows if r["kind"] == SWEEP], knobs, metrics))
    report.comparison, report.comparison_runs, report.notes = _comparison(group_by_label(phased), phases,
                                                                          metrics)
    return report


def sweep_tables(rows: list[dict], knobs: list[str], metrics: list[str]) -> list[SweepTable]:
    """One table per sweep label of the (already ordered) sweep rows: its point, the run fields and
    knobs that vary between its points, the knobs that differ between the sweeps (constant in this one,
    but what tells it from another), then `salactl sweep`'s columns and every other metric present."""
    tables = []
    # knobs that set sweeps apart: a column of every sweep's table, also where it is constant in it
    apart = [k for k in knobs if len({repr(r.get(f"knob.{k}")) for r in rows}) > 1]
    for label in dict.fromkeys(r["label"] for r in rows):
        points = [r for r in rows if r["label"] == label]
        varying = [k for k in knobs if len({repr(p.get(f"knob.{k}")) for p in points}) > 1]
        shared = {f: points[0].get(f) for f in SWEEP_RUN_FIELDS if len({p.get(f) for p in points}) == 1}
        present = [m for m in metrics if any(p.get(m) is not None for p in points)]
        lead = [m for m in SWEEP_LEAD_METRICS if m in present]
        columns = ["phase", *(f for f in SWEEP_RUN_FIELDS if f not in shared), *(f"knob.{k}" for k in varying),
                   *(f"knob.{k}" for k in apart if k not in varying), *lead, *(m for m in present if m not in lead)]
        names = point_names(points, varying)
        tables.append(SweepTable(label, shared, varying, columns,
                                 [{c: p.get(c) for c in columns} | {"phase": n} for p, n in zip(points, names)]))
    return tables


def point_names(points: list[dict], varying: list[str]) -> list:
    """Each point's name as the label's latest sweep names it: --resume reuses a recorded point under
    the name this sweep gives it (the knobs its grid varies, salactl/bench/sweep_grid.py), but the
    record keeps the name it was measured under. Where the points come from one run, their names as
    recorded; where the latest run's names would not tell the points apart (it measured none of its
    own), names by the knobs that vary between them, as a sweep over all of them names them."""
    names = [p.get("phase") for p in points]
    runs = sorted({str(p.get("run_id")) for p in points})      # run ids begin with their start time
    if len(runs) < 2:
        return names
    latest = [p for p in points if str(p.get("run_id")) == runs[-1]]
    named_by = _name_knobs(latest[0])
    if all(_point_name(p, named_by) == p.get("phase") for p in latest):    # else a name edited by hand
        names = [_point_name(p, named_by) for p in points]
    return names if len(set(map(repr, names))) == len(names) else [_point_name(p, varying) for p in points]


def _name_knobs(point: dict) -> list[str]:
    """The knobs a recorded point's name is made of, in the sweep's order."""
    parts = set(str(point.get("phase")).split("-"))
    return [k for k, abbr in LABEL_ABBR.items() if f"{abbr}{point.get(f'knob.{k}')}" in parts]


def _point_name(point: dict, knobs: list[str]) -> str:
    return "-".join(f"{LABEL_ABBR[k]}{point.get(f'knob.{k}')}" for k in knobs) or "default"


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

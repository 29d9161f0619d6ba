"""PNG plots for the HTML report (matplotlib, from the optional `plots` extra). Returns PNG bytes
per figure; `available()` is False when matplotlib is missing, and the report says so."""

from __future__ import annotations

import io
import math

from salactl.reports.latency import SWEEP, LatencyReport
from salactl.reports.render_text import fmt

LATENCY_FAMILIES = {
    "TTFT (ms)": ("mean_ttft_ms", "median_ttft_ms", "p90_ttft_ms", "p99_ttft_ms"),
    "TPOT (ms)": ("mean_tpot_ms", "median_tpot_ms", "p90_tpot_ms", "p99_tpot_ms"),
    "ITL (ms)": ("mean_itl_ms", "median_itl_ms", "p90_itl_ms", "p99_itl_ms"),
    "E2E latency (ms)": ("mean_e2e_latency_ms", "median_e2e_latency_ms", "p99_e2e_latency_ms"),
    "request throughput (req/s)": ("request_throughput", "request_goodput"),
    "token throughput (tok/s)": ("input_throughput", "output_throughput", "total_throughput"),
}
SWEEP_METRICS = ("output_throughput", "p99_ttft_ms", "median_tpot_ms", "median_itl_ms")
SWEEP_RUN_METRICS = (*SWEEP_METRICS, "logit_kl_mean", "passkey_accuracy")     # a sweep's accuracy proxies too


def available() -> bool:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def _png(fig) -> bytes:
    import matplotlib.pyplot as plt

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90, bbox_inches="tight")
    plt.close(fig)
    return buf.getvalue()


def _number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _record_names(rows: list[dict], knobs: list[str]) -> list[str]:
    """Legend names: the label; for a label with several records in the phase, also the knobs that
    tell them apart (or the run_id where none does)."""
    names = []
    for r in rows:
        same = [x for x in rows if x["label"] == r["label"]]
        if len(same) == 1:
            names.append(str(r["label"]))
            continue
        apart = [k for k in knobs if len({fmt(x.get(f"knob.{k}")) for x in same}) > 1]
        parts = [f"{k}={fmt(r.get(f'knob.{k}'))}" for k in apart] or [str(r.get("run_id"))]
        names.append(f"{r['label']} ({', '.join(parts)})")
    return names


def bar_series(report: LatencyReport, phase: str,
               family: tuple[str, ...]) -> tuple[list[str], list[tuple[str, list[float]]]]:
    """(metrics of the family some record of the phase has, [(legend name, values)] per record of
    the phase); a metric a record lacks is NaN, so it gets no bar rather than a 0 bar."""
    rows = report.phase_rows(phase)
    metrics = [m for m in family if any(_number(r.get(m)) for r in rows)]
    return metrics, [(name, [r[m] if _number(r.get(m)) else math.nan for m in metrics])
                     for name, r in zip(_record_names(rows, report.knobs), rows)]


def bar_charts(report: LatencyReport) -> list[tuple[str, bytes]]:
    """Per phase and metric family: grouped bars, one group per metric, one bar per record."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figs = []
    for phase in report.phases:
        for title, family in LATENCY_FAMILIES.items():
            metrics, series = bar_series(report, phase, family)
            if not metrics:
                continue
            missing = any(math.isnan(v) for _, values in series for v in values)
            caption = f"{phase}: {title}" + (" (no bar: not recorded)" if missing else "")
            fig, ax = plt.subplots(figsize=(7, 3.2))
            width = 0.8 / len(series)
            for i, (name, values) in enumerate(series):
                ax.bar([j + i * width for j in range(len(metrics))], values, width, label=name)
            ax.set_xticks([j + width * (len(series) - 1) / 2 for j in range(len(metrics))])
            ax.set_xticklabels(metrics, fontsize=8)
            ax.set_title(caption, fontsize=9)
            ax.legend(fontsize=7)
            figs.append((caption, _png(fig)))
    return figs


def _line_chart(title: str, knob: str, metric: str, lines: list[tuple[str, list[dict]]]) -> bytes | None:
    """`metric` against `knob`, one line per (legend name, rows); None when no row has both."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    drawn = [(name, sorted((r[f"knob.{knob}"], r[metric]) for r in rows
                           if _number(r.get(metric)) and _number(r.get(f"knob.{knob}"))))
             for name, rows in lines]
    drawn = [(name, pts) for name, pts in drawn if pts]
    if not drawn:
        return None
    fig, ax = plt.subplots(figsize=(6, 3.2))
    for name, pts in drawn:
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=name)
    ax.set_xlabel(knob)
    ax.set_ylabel(metric)
    ax.set_title(title)
    ax.legend(fontsize=8)
    return _png(fig)


def sweep_charts(report: LatencyReport) -> list[tuple[str, bytes]]:
    """Bench/run records: metric vs. the first numeric varying knob, one line per label, per phase."""
    rows = [r for r in report.rows if r["kind"] != SWEEP]
    knob = next((k for k in report.knobs
                 if all(_number(r.get(f"knob.{k}")) for r in rows if r.get(f"knob.{k}") is not None)
                 and len({r.get(f"knob.{k}") for r in rows}) > 2), None)
    if knob is None:
        return []
    figs = []
    for phase in report.phases:
        mine = report.phase_rows(phase)
        for m in SWEEP_METRICS:
            title = f"{phase}: {m} vs {knob}"
            png = _line_chart(title, knob, m, [(label, [r for r in mine if r["label"] == label])
                                               for label in report.labels])
            if png is not None:
                figs.append((title, png))
    return figs


def sweep_lines(report: LatencyReport) -> tuple[str | None, list[tuple[str, list[dict]]]]:
    """(the first numeric knob a sweep varies, [(legend name, points)]): one line per sweep label and
    combination of its other varying knobs; (None, []) when no sweep varies a numeric knob."""
    knob = next((k for t in report.sweeps for k in t.knobs
                 if all(_number(r.get(f"knob.{k}")) for r in t.rows)), None)
    lines = []
    for t in report.sweeps:
        if knob not in t.knobs:
            continue
        others = [k for k in t.knobs if k != knob]
        groups: dict[tuple, list[dict]] = {}
        for r in t.rows:
            groups.setdefault(tuple(fmt(r.get(f"knob.{k}")) for k in others), []).append(r)
        for values, rows in groups.items():
            apart = ", ".join(f"{k}={v}" for k, v in zip(others, values))
            lines.append((f"{t.label} ({apart})" if apart else t.label, rows))
    return knob, lines


def sweep_run_charts(report: LatencyReport) -> list[tuple[str, bytes]]:
    """Sweeps: per metric (speed and accuracy), the points against a knob (sweep_lines)."""
    knob, lines = sweep_lines(report)
    if knob is None:
        return []
    figs = []
    for m in SWEEP_RUN_METRICS:
        title = f"sweep: {m} vs {knob}"
        png = _line_chart(title, knob, m, lines)
        if png is not None:
            figs.append((title, png))
    return figs

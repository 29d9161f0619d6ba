"""PNG plots for the HTML report (matplotlib, from the optional `plots` extra). Returns (caption,
PNG bytes) per figure; `available()` is False when matplotlib is missing or fails to import (a broken
config directory raises RuntimeError/OSError there: reports/pyplot.py), with one warning line naming
why, and the report says so.

All text (labels, phases, knob and metric names) is drawn literally (a lone surrogate as its backslash
escape, as the files write it): no mathtext for `$`, and a
label starting with `_` still gets its legend entry. A chart draws at most MAX_SERIES records
(bars) or lines, the first ones in report order; its caption says how many more the tables hold.
A line chart needs a knob with at least 2 distinct finite values among the points it draws. A
figure that fails to draw anyway is left out with one `warning:` line (the tables are still written),
and a matplotlib warning (a glyph its font lacks) is one such line too."""

from __future__ import annotations

import io
import math
import warnings
from collections.abc import Callable

from salactl.output import warn_once
from salactl.reports.latency import SWEEP, LatencyReport
from salactl.reports.pyplot import first_line, pyplot
from salactl.reports.records import group_by_label, is_finite_number
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
# bars or lines per chart: a legend of hundreds is unreadable, and 1500 took matplotlib ~50 s
MAX_SERIES = 20


def available() -> bool:
    return pyplot() is not None


def _figure(caption: str, size: tuple[float, float], draw: Callable) -> tuple[str, bytes] | None:
    """(caption, PNG) of a figure that draw(ax) fills, with every text literal; None, with one
    warning line, where matplotlib fails on it. matplotlib's own warnings become one line each."""
    plt = pyplot()
    if plt is None:
        return None
    import matplotlib
    import matplotlib.text

    with matplotlib.rc_context({"text.parse_math": False}), warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        # numpy's overflow warnings (bars at +-1.7e308) mean an empty, wrong figure: left out too
        warnings.simplefilter("error", RuntimeWarning)
        fig, ax = plt.subplots(figsize=size)
        try:
            draw(ax)
            ax.set_title(caption, fontsize=9)
            for text in fig.findobj(matplotlib.text.Text):
                text.set_text(_drawable(text.get_text()))
            buf = io.BytesIO()
            fig.savefig(buf, format="png", dpi=90, bbox_inches="tight")
        except Exception as e:          # a figure must not cost the report its tables
            warn_once(f"plot {caption!r} left out: matplotlib failed: {type(e).__name__}: {first_line(e)}")
            return None
        finally:
            plt.close(fig)
    for w in said:
        if "missing from font" in str(w.message):         # one per glyph and figure otherwise
            warn_once("plots: a character in a label has no glyph in matplotlib's font; drawn as a box")
        else:
            warn_once(f"plot {caption!r}: matplotlib: {first_line(w.message)}")
    return caption, buf.getvalue()


def _drawable(text: str) -> str:
    """A lone surrogate (a byte of a non-UTF-8 label or file name, as Python decodes it) as the
    backslash escape the report's files write: matplotlib's font code takes only valid Unicode."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def _legend(ax, handles: list, names: list[str], fontsize: int) -> None:
    # explicit: matplotlib leaves out artists whose label starts with "_"; beside the axes, where
    # MAX_SERIES entries do not cover the bars or the title
    ax.legend(handles, names, fontsize=fontsize, loc="upper left", bbox_to_anchor=(1.01, 1))


def _capped(caption: str, items: list, noun: str) -> tuple[str, list]:
    if len(items) <= MAX_SERIES:
        return caption, items
    more = len(items) - MAX_SERIES
    return f"{caption} (first {MAX_SERIES} {noun}; {more} more in the tables)", items[:MAX_SERIES]


def _record_names(rows: list[dict], knobs: list[str]) -> list[str]:
    """Legend names: the label; for a label with several records in the phase, also the knobs that
    tell them apart (or the run_id where none does)."""
    by_label = group_by_label(rows)
    names = []
    for r in rows:
        same = by_label[r["label"]]
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
    metrics = [m for m in family if any(is_finite_number(r.get(m)) for r in rows)]
    return metrics, [(name, [r[m] if is_finite_number(r.get(m)) else math.nan for m in metrics])
                     for name, r in zip(_record_names(rows, report.knobs), rows)]


def _bars(metrics: list[str], series: list[tuple[str, list[float]]]) -> Callable:
    def draw(ax) -> None:
        width = 0.8 / len(series)
        handles = [ax.bar([j + i * width for j in range(len(metrics))], values, width)
                   for i, (_, values) in enumerate(series)]
        ax.set_xticks([j + width * (len(series) - 1) / 2 for j in range(len(metrics))])
        ax.set_xticklabels(metrics, fontsize=8)
        _legend(ax, handles, [name for name, _ in series], 7)
    return draw


def bar_charts(report: LatencyReport) -> list[tuple[str, bytes]]:
    """Per phase and metric family: grouped bars, one group per metric, one bar per record."""
    figs = []
    for phase in report.phases:
        for title, family in LATENCY_FAMILIES.items():
            metrics, series = bar_series(report, phase, family)
            if not metrics:
                continue
            missing = any(math.isnan(v) for _, values in series for v in values)
            caption = f"{phase}: {title}" + (" (no bar: not recorded)" if missing else "")
            caption, series = _capped(caption, series, "records")
            figs.append(_figure(caption, (7, 3.2), _bars(metrics, series)))
    return [f for f in figs if f is not None]


def _points(rows: list[dict], knob: str, metric: str) -> list[tuple]:
    """(knob, metric) of the rows that have both as finite numbers (a knob of 10**400 is left out:
    matplotlib cannot place it), sorted by the knob."""
    return sorted((r[f"knob.{knob}"], r[metric]) for r in rows
                  if is_finite_number(r.get(metric)) and is_finite_number(r.get(f"knob.{knob}")))


def _line_chart(title: str, knob: str, metric: str,
                lines: list[tuple[str, list[dict]]]) -> tuple[str, bytes] | None:
    """`metric` against `knob`, one line per (legend name, rows); None when the points it would
    draw have fewer than 2 distinct knob values (nothing to draw a line along)."""
    drawn = [(name, _points(rows, knob, metric)) for name, rows in lines]
    drawn = [(name, pts) for name, pts in drawn if pts]
    if len({x for _, pts in drawn for x, _ in pts}) < 2:
        return None
    title, drawn = _capped(title, drawn, "lines")

    def draw(ax) -> None:
        handles = [ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o")[0] for _, pts in drawn]
        ax.set_xlabel(knob)
        ax.set_ylabel(metric)
        _legend(ax, handles, [name for name, _ in drawn], 8)
    return _figure(title, (6, 3.2), draw)


def _numeric_knob(knobs: list[str], rows: list[dict]) -> str | None:
    """The first knob that is a number (or unset) in every row and has 2 or more finite values."""
    def numeric(k: str) -> bool:
        values = [r.get(f"knob.{k}") for r in rows if r.get(f"knob.{k}") is not None]
        return (all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values)
                and len({v for v in values if is_finite_number(v)}) >= 2)
    return next((k for k in knobs if numeric(k)), None)


def sweep_charts(report: LatencyReport) -> list[tuple[str, bytes]]:
    """Bench/run records: per phase, metric vs. the first numeric knob that varies within the phase,
    one line per label (a SOAR bench, whose phases differ only in max_concurrency, has none)."""
    figs = []
    for phase in report.phases:
        mine = report.phase_rows(phase)
        knob = _numeric_knob(report.knobs, mine)
        if knob is None:
            continue
        lines = [(str(label), rows) for label, rows in group_by_label(mine).items()]
        figs += [_line_chart(f"{phase}: {m} vs {knob}", knob, m, lines) for m in SWEEP_METRICS]
    return [f for f in figs if f is not None]


def sweep_lines(report: LatencyReport) -> tuple[str | None, list[tuple[str, list[dict]]]]:
    """(the first numeric knob a sweep varies, [(legend name, points)]): one line per sweep label and
    combination of its other varying knobs; (None, []) when no sweep varies a numeric knob."""
    knob = next((k for t in report.sweeps for k in [_numeric_knob(t.knobs, t.rows)] if k), None)
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
    figs = [_line_chart(f"sweep: {m} vs {knob}", knob, m, lines) for m in SWEEP_RUN_METRICS]
    return [f for f in figs if f is not None]

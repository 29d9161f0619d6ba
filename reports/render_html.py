"""A self-contained HTML page for a LatencyReport: the Markdown tables as HTML plus plots
embedded as base64 PNGs (no external files, scripts or fonts)."""

from __future__ import annotations

import base64
import html

from salactl.reports import plots
from salactl.reports.latency import LatencyReport
from salactl.reports.render_text import comparison_tables, env_table, fmt, header_name, sweep_caption, sweep_table

STYLE = """body{font-family:sans-serif;margin:2em;max-width:1200px}
table{border-collapse:collapse;margin:1em 0;font-size:13px}
th,td{border:1px solid #ccc;padding:3px 8px;text-align:right}
th:first-child,td:first-child{text-align:left}
img{max-width:100%;margin:0.5em 0;border:1px solid #eee}"""


def _table(columns: list[str], rows: list[list]) -> str:
    head = "".join(f"<th>{html.escape(c)}</th>" for c in columns)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(fmt(v))}</td>" for v in r) + "</tr>" for r in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def render(report: LatencyReport, title: str = "Latency report", with_plots: bool = True) -> str:
    parts = [f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>",
             f"<style>{STYLE}</style></head><body><h1>{html.escape(title)}</h1>",
             f"<p>Runs: {html.escape(', '.join(report.labels))}. Values as recorded; nothing is "
             "recomputed.</p>"]
    for phase in report.phases:
        rows = report.phase_rows(phase)
        cols = [c for c in report.columns if c != "phase" and any(r.get(c) not in (None, "") for r in rows)]
        parts += [f"<h2>phase: {html.escape(phase)}</h2>",
                  _table([header_name(c) for c in cols], [[r.get(c) for c in cols] for r in rows])]
    for sweep in report.sweeps:
        parts += [f"<h2>sweep: {html.escape(sweep.label)}</h2>", f"<p>{html.escape(sweep_caption(sweep))}</p>",
                  _table(*sweep_table(sweep))]
    if report.comparison_runs or report.notes:
        parts.append("<h2>side by side</h2>")
    for heading, cols, rows in comparison_tables(report):
        parts += [f"<h3>{html.escape(heading)}</h3>", _table(cols, rows)]
    parts += [f"<p>Note: {html.escape(n)}</p>" for n in report.notes]
    if with_plots and plots.available():
        figs = plots.bar_charts(report) + plots.sweep_charts(report) + plots.sweep_run_charts(report)
        if figs:
            parts.append("<h2>plots</h2>")
        for caption, png in figs:
            b64 = base64.b64encode(png).decode("ascii")
            parts.append(f"<figure><img alt='{html.escape(caption)}' src='data:image/png;base64,{b64}'>"
                         f"<figcaption>{html.escape(caption)}</figcaption></figure>")
    elif with_plots:
        from salactl.reports.pyplot import unavailable

        parts.append(f"<p>No plots: {html.escape(unavailable())}.</p>")
    if report.env:
        parts += ["<h2>environment</h2>", _table(*env_table(report))]
    parts.append("</body></html>")
    return "\n".join(parts)

"""The HTML report's plots (reports/plots.py) draw labels as given: a `$` is a dollar, not mathtext,
and a label starting with `_` keeps its legend entry; a knob integer past float's range is left out
of a chart; a SOAR bench (one max_concurrency per phase) gets no one-point line charts; a chart
draws at most MAX_SERIES records or lines and says how many more there are; and a figure
matplotlib fails on is left out with one warning line while every report file is still written."""

import json
import subprocess
import sys
import warnings

import pytest

from salactl.reports import plots
from test_report_latency_records import rec, report_of
from test_report_latency_sweep import sweep_point

import matplotlib  # noqa: E402,F401  (the [test] extra installs it: missing is a failure, not a skip)


@pytest.fixture
def drawn_texts(monkeypatch):
    """Every non-empty text of each figure the plots save: [(title, {text: parse_math})]. It spies
    on matplotlib's savefig (not on salactl) and saves as before."""
    from matplotlib.figure import Figure
    from matplotlib.text import Text

    figures = []
    save = Figure.savefig

    def spy(fig, *args, **kwargs):
        out = save(fig, *args, **kwargs)    # tick labels are made while drawing
        texts = {t.get_text(): t.get_parse_math() for t in fig.findobj(Text) if t.get_text()}
        figures.append((fig.axes[0].get_title(), texts))
        return out

    monkeypatch.setattr(Figure, "savefig", spy)
    return figures


def legend_names(fig_texts, labels):
    return [text for text in fig_texts if text in labels]


def salactl(*args):
    return subprocess.run([sys.executable, "-m", "salactl", *map(str, args)], capture_output=True, text=True,
                          timeout=180)


@pytest.mark.parametrize("labels", [["batch $x^$ test", "plan $5 vs $6"],     # mathtext raised on the first
                                    ["plan $5 vs $6", "$\\alpha$ run"]])      # and drew these as math
def test_dollar_signs_are_drawn_literally(tmp_path, drawn_texts, labels):
    r = report_of(tmp_path, [rec(label, "p$1", knobs={"max_concurrency": c, "k$": c}, mean_ttft_ms=1.0 + c,
                                 output_throughput=10.0 * c) for label in labels for c in (1, 4, 16)])
    captions = [c for c, png in plots.bar_charts(r) + plots.sweep_charts(r) if png.startswith(b"\x89PNG")]
    assert "p$1: TTFT (ms)" in captions and "p$1: output_throughput vs max_concurrency" in captions
    assert len(drawn_texts) == len(captions)
    for title, texts in drawn_texts:
        assert title in captions and texts[title] is False
        assert not any(texts.values()), texts          # no text of any figure is read as math
    line = dict(drawn_texts)["p$1: output_throughput vs max_concurrency"]
    assert legend_names(line, labels) == labels


def test_a_dollar_label_report_writes_every_file(tmp_path):
    p = tmp_path / "records.jsonl"
    p.write_text("".join(json.dumps(rec(label, "S1", mean_ttft_ms=m)) + "\n"
                         for label, m in (("batch $x^$ test", 1.0), ("plan $5 vs $6", 2.0))))
    res = salactl("report", "latency", p, "--out", tmp_path / "rep")
    assert res.returncode == 0, res.stderr
    assert res.stderr == ""
    html = (tmp_path / "rep" / "report.html").read_text()
    assert "batch $x^$ test" in (tmp_path / "rep" / "report.md").read_text()
    assert (tmp_path / "rep" / "report.csv").exists() and html.count("data:image/png;base64,") == 1


def test_underscore_labels_keep_their_legend_entries(tmp_path, drawn_texts):
    labels = ["_base", "_new"]
    r = report_of(tmp_path, [rec(label, "S1", mean_ttft_ms=m) for label, m in zip(labels, (1.0, 2.0))])
    with warnings.catch_warnings():
        warnings.simplefilter("error")               # matplotlib's "No artists with labels found"
        (caption, png), = plots.bar_charts(r)
    assert caption == "S1: TTFT (ms)" and png.startswith(b"\x89PNG")
    (_, texts), = drawn_texts
    assert legend_names(texts, labels) == labels


def test_a_knob_past_float_range_is_left_out_of_the_chart(tmp_path, drawn_texts):
    points = [sweep_point("a", 10**400, 8, 0.5, 1.0, 30.0), sweep_point("a", 16, 8, 0.25, 1.0, 20.0),
              sweep_point("a", 32, 8, 0.125, 1.0, 10.0)]
    benches = [rec("b", "S1", knobs={"max_concurrency": c}, output_throughput=float(i + 1))
               for i, c in enumerate((10**400, 1, 4))]
    r = report_of(tmp_path, [*points, *benches])
    captions = [c for c, png in plots.sweep_run_charts(r) + plots.sweep_charts(r) if png.startswith(b"\x89PNG")]
    assert "sweep: logit_kl_mean vs dense_len" in captions
    assert captions[-1] == "S1: output_throughput vs max_concurrency"
    # two points left per chart: not with 10**400, which has no place on a float axis
    two = report_of(tmp_path, [points[0], points[1], benches[0], benches[1]])
    assert plots.sweep_run_charts(two) == [] and plots.sweep_charts(two) == []


def test_a_soar_bench_gets_no_one_point_line_charts(tmp_path):
    records = [rec(label, phase, knobs={"max_concurrency": c}, output_throughput=100.0 * (c or 16),
                   mean_ttft_ms=5.0) for label in ("a", "b") for phase, c in (("S1", 1), ("S8", 8), ("Smax", None))]
    r = report_of(tmp_path, records)
    assert plots.sweep_charts(r) == []
    assert [c for c, _ in plots.bar_charts(r)] == [f"{p}: {t}" for p in ("S1", "S8", "Smax")
                                                 for t in ("TTFT (ms)", "token throughput (tok/s)")]


def test_a_chart_draws_the_first_records_and_says_how_many_more(tmp_path, drawn_texts):
    n = plots.MAX_SERIES + 7
    labels = [f"L{i}" for i in range(n)]
    r = report_of(tmp_path, [rec(label, "S1", knobs={"max_concurrency": c}, output_throughput=float(c + i))
                             for i, label in enumerate(labels) for c in (1, 4)])
    (bars, _), = plots.bar_charts(r)
    assert bars == f"S1: token throughput (tok/s) (first {plots.MAX_SERIES} records; {2 * n - 20} more in the tables)"
    lines = [c for c, _ in plots.sweep_charts(r)]
    assert lines == [f"S1: output_throughput vs max_concurrency (first {plots.MAX_SERIES} lines; 7 more in the tables)"]
    line = dict(drawn_texts)[lines[0]]
    assert legend_names(line, labels) == labels[:plots.MAX_SERIES]


def test_a_figure_matplotlib_fails_on_is_left_out_with_one_warning_line(tmp_path):
    """Bars at +-1.7e308 overflow matplotlib's axis arithmetic: that figure goes, the rest stay."""
    p = tmp_path / "records.jsonl"
    p.write_text("".join(json.dumps(r) + "\n" for r in (
        rec("a", "S1", mean_ttft_ms=1.7e308), rec("b", "S1", mean_ttft_ms=-1.7e308),
        rec("a", "S2", mean_ttft_ms=1.0), rec("b", "S2", mean_ttft_ms=2.0))))
    res = salactl("report", "latency", p, "--out", tmp_path / "rep")
    assert res.returncode == 0, res.stderr
    (line,) = res.stderr.strip().splitlines()
    assert line.startswith("warning: plot 'S1: TTFT (ms)' left out: matplotlib failed: RuntimeWarning: overflow")
    html = (tmp_path / "rep" / "report.html").read_text()
    assert html.count("data:image/png;base64,") == 1 and "<figcaption>S2: TTFT (ms)</figcaption>" in html
    assert {f.name for f in (tmp_path / "rep").iterdir()} == {"report.md", "report.csv", "report.html"}

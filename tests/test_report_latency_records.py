"""`salactl report latency` on mixed records: a phase that is not a name is a one-line error; the
side-by-side table compares the labels each phase has, with their target, model and failures; every
environment of a label is listed; plots draw every record and no invented zero; nested knobs are
compact JSON; --format is a usage error and a directory in place of a records file an input error,
each saying why."""

import csv
import io
import json
import math

import pytest

from conftest import run_cli
from salactl.errors import DatasetError, UsageError
from salactl.reports import plots
from salactl.reports.latency import build
from salactl.reports.records import load_records
from salactl.reports.render_html import render
from salactl.reports.render_text import csv_text, markdown

ENV = {"git_sha": "2aa7181", "git_dirty": False, "salactl": "0.1.0", "torch": "2.13.0+cpu", "cpu": "x86_64",
       "cpu_count": 2, "gpu": None}


def rec(label, phase, target="embedded", model="sala-nano", env=ENV, knobs=None, **metrics):
    """A bench phase record (salactl/bench/records.py make_record) with the given metrics."""
    return {"schema_version": 1, "kind": "bench", "run_id": f"{label}-{phase}", "label": label,
            "profile": "soar", "phase": phase, "target": target, "model": model,
            "completed": 12, "failed": 0, **metrics, "knobs": knobs or {"max_concurrency": 1}, "env": env}


def report_of(tmp_path, records):
    p = tmp_path / "records.jsonl"
    p.write_text("".join(json.dumps(r) + "\n" for r in records))
    return build(load_records([p]))


def one_error_line(code, err, exit_code=DatasetError.exit_code):
    """A bad records file is an input file error (exit 7), as a bad --calib or --prompt-file is."""
    assert code == exit_code, (code, err)
    (line,) = err.strip().splitlines()
    assert line.startswith("error: ")
    return line


@pytest.mark.parametrize("phase", ["missing", None, 3, {"name": "S1"}, ""])
def test_a_record_whose_phase_is_not_a_name_is_a_one_line_error(tmp_path, capsys, phase):
    bad = rec("b", "S1", mean_ttft_ms=2.0)
    if phase == "missing":
        del bad["phase"]
    else:
        bad["phase"] = phase
    p = tmp_path / "records.jsonl"
    p.write_text("".join(json.dumps(r) + "\n" for r in (rec("a", "S1", mean_ttft_ms=1.0), bad)))
    code, out, err = run_cli(["report", "latency", p], capsys)
    line = one_error_line(code, err)
    assert f"{p}:2: 'phase' must be" in line and out == ""


MIXED = [rec("a", "S1", mean_ttft_ms=10.0, output_throughput=100.0),
         rec("a", "S8", mean_ttft_ms=20.0, output_throughput=400.0),
         rec("http", "S1", target="sglang", model="fake-model", failed=4, completed=8, mean_ttft_ms=30.0,
             output_throughput=50.0)]


def test_side_by_side_compares_the_labels_a_phase_has_and_shows_what_they_ran(tmp_path):
    r = report_of(tmp_path, MIXED)
    assert r.comparison_runs == {"S1": {"a": {"target": "embedded", "model": "sala-nano", "failed": 0},
                                        "http": {"target": "sglang", "model": "fake-model", "failed": 4}}}
    ttft = next(c for c in r.comparison if c["metric"] == "mean_ttft_ms")
    assert ttft["values"] == {"a": 10.0, "http": 30.0} and ttft["relative"]["http"] == 3.0
    (note,) = r.notes
    assert note.startswith("not side by side: phase S8 (a ×1)"), note
    md = markdown(r)
    assert "### phase S1 (relative to a); failed requests: http 4" in md
    assert "| target | embedded | sglang |  |" in md and "| model | sala-nano | fake-model |  |" in md
    assert f"Note: {note}" in md
    html = render(r, with_plots=False)
    assert "<h3>phase S1 (relative to a); failed requests: http 4</h3>" in html and "fake-model" in html


def test_without_any_comparable_phase_the_report_says_why(tmp_path):
    r = report_of(tmp_path, [rec("a", "S1", mean_ttft_ms=1.0), rec("a", "S1", mean_ttft_ms=2.0),
                             rec("b", "S8", mean_ttft_ms=3.0)])
    assert r.comparison == [] and r.comparison_runs == {}
    (note,) = r.notes
    assert note.startswith("no side-by-side table: phase S1 (a ×2), phase S8 (b ×1)"), note
    assert f"## side by side\n\nNote: {note}" in markdown(r)
    assert report_of(tmp_path, [rec("a", "S1", mean_ttft_ms=1.0)]).notes == []     # one label: nothing to say


def test_every_environment_of_a_label_is_a_row_with_its_cpu(tmp_path):
    other = {**ENV, "git_sha": "deadbee", "torch": "2.9.0"}
    r = report_of(tmp_path, [rec("b", "S1", mean_ttft_ms=1.0), rec("b", "S8", env=other, mean_ttft_ms=2.0),
                             rec("b", "Smax", env=other, mean_ttft_ms=3.0)])
    assert [(e["git_sha"], e["torch"], e["cpu"], e["phases"]) for e in r.env] == [
        ("2aa7181", "2.13.0+cpu", "x86_64", "S1"), ("deadbee", "2.9.0", "x86_64", "S8, Smax")]
    md = markdown(r).split("## environment")[1]
    assert "| label | cpu | git_sha | git_dirty | salactl | torch | phases |" in md
    assert "| b | x86_64 | deadbee | false | 0.1.0 | 2.9.0 | S8, Smax |" in md


def test_bars_cover_every_record_and_leave_an_absent_metric_out(tmp_path):
    r = report_of(tmp_path, [rec("a", "S1", knobs={"max_concurrency": 1}, mean_ttft_ms=1.0, p99_ttft_ms=4.0),
                             rec("a", "S1", knobs={"max_concurrency": 8}, mean_ttft_ms=2.0),
                             rec("b", "S1", mean_ttft_ms=3.0, p99_ttft_ms=5.0)])
    metrics, series = plots.bar_series(r, "S1", plots.LATENCY_FAMILIES["TTFT (ms)"])
    assert metrics == ["mean_ttft_ms", "p99_ttft_ms"]
    assert [name for name, _ in series] == ["a (max_concurrency=1)", "a (max_concurrency=8)", "b"]
    values = dict(series)
    assert values["a (max_concurrency=1)"] == [1.0, 4.0] and values["b"] == [3.0, 5.0]
    assert values["a (max_concurrency=8)"][0] == 2.0 and math.isnan(values["a (max_concurrency=8)"][1])
    import matplotlib  # noqa: F401  (the [test] extra installs it: missing is a failure, not a skip)
    captions = [c for c, png in plots.bar_charts(r) if png.startswith(b"\x89PNG")]
    assert captions == ["S1: TTFT (ms) (no bar: not recorded)"]


def test_nested_knobs_are_compact_json_in_markdown_and_csv(tmp_path):
    target = {"engine": "reference", "dtype": "float32"}
    r = report_of(tmp_path, [rec("a", "S1", knobs={"target": target, "dataset": {"kind": "soar"}}, duration=1.0),
                             rec("b", "S1", knobs={"target": {**target, "dtype": "bfloat16"}}, duration=2.0)])
    md = markdown(r)
    assert '| {"engine":"reference","dtype":"float32"} |' in md and "{'engine'" not in md
    rows = list(csv.DictReader(io.StringIO(csv_text(r))))
    assert [row["knob.target"] for row in rows] == ['{"engine":"reference","dtype":"float32"}',
                                                   '{"engine":"reference","dtype":"bfloat16"}']
    assert [row["knob.dataset"] for row in rows] == ['{"kind":"soar"}', ""]


def test_two_formats_without_out_are_refused_not_half_printed(tmp_path, capsys):
    p = tmp_path / "records.jsonl"
    p.write_text(json.dumps(MIXED[0]) + "\n")
    for formats in ("md,csv", "csv,html"):
        code, out, err = run_cli(["report", "latency", p, "--format", formats], capsys)
        line = one_error_line(code, err, UsageError.exit_code)
        assert f"--format {formats}" in line and "--out DIR" in line and out == ""
    code, out, err = run_cli(["report", "latency", p], capsys)       # the default: Markdown only
    assert code == 0 and out.startswith("# Latency report"), err


def test_a_directory_in_place_of_a_records_file_names_the_file_inside(tmp_path, capsys):
    (tmp_path / "runs").mkdir()
    code, _, err = run_cli(["report", "latency", tmp_path / "runs"], capsys)
    assert "records.jsonl" not in one_error_line(code, err)
    (tmp_path / "runs" / "records.jsonl").write_text(json.dumps(MIXED[0]) + "\n")
    code, _, err = run_cli(["report", "latency", tmp_path / "runs"], capsys)
    line = one_error_line(code, err)
    assert f"records file {tmp_path / 'runs'} is a directory; give {tmp_path / 'runs' / 'records.jsonl'}" in line


def test_knobs_past_float_range_order_the_rows_exactly_and_stay_exact_in_the_tables(tmp_path):
    # pandas < 3.1 raised OverflowError sorting such a knob; float order would also tie 10**400 and 10**400 + 1
    big = 10**400
    r = report_of(tmp_path, [rec("a", "S1", knobs={"max_concurrency": c}, mean_ttft_ms=float(i))
                             for i, c in enumerate((big + 1, 16, big, 2))])
    assert [row["knob.max_concurrency"] for row in r.rows] == [2, 16, big, big + 1]
    assert [row["mean_ttft_ms"] for row in r.rows] == [3.0, 1.0, 2.0, 0.0]
    body = list(csv.DictReader(io.StringIO(csv_text(r))))
    assert [row["knob.max_concurrency"] for row in body] == ["2", "16", str(big), str(big + 1)]

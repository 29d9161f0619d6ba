"""`salactl report` (latency) rendered from stored records through the real CLI."""

import csv
import io
import json
import os
import subprocess
import sys

import pytest

from salactl.errors import DatasetError, OutputExistsError, OutputWriteError, UsageError
from salactl.reports.atomic import write_all
from salactl.reports.latency import build
from salactl.reports.records import load_records
from conftest import unwritable_out


def salactl(*args):
    return subprocess.run([sys.executable, "-m", "salactl", *args], capture_output=True, text=True, timeout=180)


def record(label, phase, concurrency, **metrics):
    return {"schema_version": 1, "kind": "bench", "run_id": f"{label}-{concurrency}", "label": label,
            "profile": "serving", "phase": phase, "target": "embedded", "model": "sala-nano", **metrics,
            "knobs": {"max_concurrency": concurrency, "weights": label.split("+")[0], "seed": 0},
            "env": {"gpu": "NVIDIA H200", "git_sha": "0123abc", "torch": "2.11.0"}}


RECORDS = [
    record("bf16", "main", 1, duration=10.0, completed=32, failed=0, request_throughput=3.2,
           output_throughput=409.6, mean_ttft_ms=41.25, median_ttft_ms=40.0, p99_ttft_ms=88.5,
           median_tpot_ms=7.75, mean_itl_ms=7.8),
    record("bf16", "main", 4, duration=4.0, completed=32, failed=0, request_throughput=8.0,
           output_throughput=1024.0, mean_ttft_ms=52.0, median_ttft_ms=50.5, p99_ttft_ms=120.25,
           median_tpot_ms=9.5, mean_itl_ms=9.6),
    record("bf16", "main", 16, duration=2.5, completed=32, failed=1, request_throughput=12.8,
           output_throughput=1638.4, mean_ttft_ms=80.0, median_ttft_ms=77.0, p99_ttft_ms=201.0,
           median_tpot_ms=14.0, mean_itl_ms=14.5),
    record("w4a16+fp8", "main", 1, duration=7.0, completed=32, failed=0, request_throughput=4.571,
           output_throughput=585.1, mean_ttft_ms=38.0, median_ttft_ms=37.0, p99_ttft_ms=70.0,
           median_tpot_ms=5.25, mean_itl_ms=5.3),
    record("w4a16+fp8", "main", 4, duration=3.0, completed=32, failed=0, request_throughput=10.67,
           output_throughput=1365.3, mean_ttft_ms=45.0, median_ttft_ms=44.0, p99_ttft_ms=99.0,
           median_tpot_ms=6.5, mean_itl_ms=6.6),
    record("w4a16+fp8", "main", 16, duration=1.9, completed=32, failed=0, request_throughput=16.84,
           output_throughput=2156.0, mean_ttft_ms=61.0, median_ttft_ms=60.0, p99_ttft_ms=150.0,
           median_tpot_ms=9.0, mean_itl_ms=9.1),
]


@pytest.fixture
def records_file(tmp_path):
    p = tmp_path / "records.jsonl"
    p.write_text("\n".join(json.dumps(r) for r in RECORDS) + "\n")
    return p


def test_report_model_keeps_recorded_values(records_file):
    rep = build(load_records([records_file]))
    assert rep.labels == ["bf16", "w4a16+fp8"]
    assert rep.knobs == ["max_concurrency", "weights"]            # seed does not vary
    assert "p90_ttft_ms" not in rep.metrics and "p99_ttft_ms" in rep.metrics
    assert [r["knob.max_concurrency"] for r in rep.rows] == [1, 4, 16, 1, 4, 16]
    assert rep.rows[2]["failed"] == 1 and rep.rows[5]["output_throughput"] == 2156.0
    assert rep.comparison == []          # several records per label and phase: no 1:1 comparison


def test_cli_renders_md_csv_html(records_file, tmp_path):
    out = tmp_path / "out"
    p = salactl("report", str(records_file), "--out", str(out), "--format", "md,csv,html", "--json")
    assert p.returncode == 0, p.stderr
    d = json.loads(p.stdout)
    assert sorted(d["files"]) == sorted(str(out / f"report.{f}") for f in ("md", "csv", "html"))
    md = (out / "report.md").read_text()
    assert "| w4a16+fp8 |" in md and "201" in md and "120.2" in md
    rows = list(csv.DictReader(io.StringIO((out / "report.csv").read_text())))
    assert len(rows) == 6
    for row, rec in zip(rows, RECORDS):
        assert row["label"] == rec["label"]
        for m in ("output_throughput", "p99_ttft_ms", "median_tpot_ms"):
            assert float(row[m]) == rec[m]                    # exactly as recorded
    html = (out / "report.html").read_text()
    assert html.startswith("<!doctype html>") and "w4a16+fp8" in html
    assert "http://" not in html and "https://" not in html and "<script" not in html
    import matplotlib  # noqa: F401  (the [test] extra installs it: missing is a failure, not a skip)
    assert html.count("data:image/png;base64,") >= 4          # bar charts + sweep lines


def test_side_by_side_comparison_for_one_record_per_label(tmp_path):
    p = tmp_path / "r.jsonl"
    p.write_text("\n".join(json.dumps(r) for r in (RECORDS[0], RECORDS[3])))
    res = salactl("report", "latency", str(p), "--json")
    assert res.returncode == 0, res.stderr
    comp = {c["metric"]: c for c in json.loads(res.stdout)["comparison"]}
    assert comp["median_tpot_ms"]["values"] == {"bf16": 7.75, "w4a16+fp8": 5.25}
    assert comp["median_tpot_ms"]["relative"]["w4a16+fp8"] == pytest.approx(5.25 / 7.75)
    md = salactl("report", str(p)).stdout                          # Markdown on stdout by default
    assert "## side by side" in md and "### phase main (relative to bf16)" in md


def test_side_by_side_table_puts_each_labels_ratio_under_its_own_column():
    """The Markdown side-by-side row has one cell per column, the "B / A" column holding B's ratio to A."""
    from salactl.reports.render_text import comparison_tables

    (heading, cols, rows), = comparison_tables(build([RECORDS[0], RECORDS[3]]))
    row = next(r for r in rows if r[0] == "median_tpot_ms")
    assert len(row) == len(cols)
    assert row[cols.index("w4a16+fp8 / bf16")] == pytest.approx(5.25 / 7.75)


def test_a_metric_one_label_lacks_stays_in_the_side_by_side_comparison():
    """A metric recorded for only some labels is still compared, the missing label's value and ratio None."""
    rep = build([record("A", "main", 1, median_tpot_ms=7.0, mean_ttft_ms=100.0),
                 record("B", "main", 1, median_tpot_ms=3.5)])
    comp = {c["metric"]: c for c in rep.comparison}
    assert comp["mean_ttft_ms"]["values"] == {"A": 100.0, "B": None}
    assert comp["mean_ttft_ms"]["relative"]["B"] is None
    assert comp["median_tpot_ms"]["relative"]["B"] == pytest.approx(0.5)


def test_report_numbers_show_a_decimal_from_a_thousand_up():
    """Report cells print 12345.6 in full (one decimal), not rounded to four significant digits."""
    from salactl.reports.render_text import fmt

    assert fmt(12345.6) == "12345.6"
    assert fmt(123.456) == "123.5"


def test_run_records_keep_their_floor_columns(tmp_path):
    """`salactl run --out` records carry the roofline floor and time over it (salactl/run_job.py)."""
    from salactl.reports.render_text import csv_text, markdown

    run = {"schema_version": 1, "kind": "run", "run_id": "r1", "label": None, "profile": "run",
           "target": "embedded", "model": "sala-nano", "completed": 1, "failed": 0,
           "total_input_tokens": 2, "total_output_tokens": 4, "peak_memory_bytes": None}
    p = tmp_path / "r.jsonl"
    p.write_text("\n".join(json.dumps(r) for r in (
        {**run, "phase": "prefill", "duration": 0.144, "mean_ttft_ms": 144.0, "floor_s": 0.00168,
         "time_over_floor": 85.7},
        {**run, "phase": "decode", "median_tpot_ms": 42.7, "floor_s": 0.00501, "time_over_floor": 25.5})))
    rep = build(load_records([p]))
    assert rep.metrics[-2:] == ["floor_s", "time_over_floor"]
    assert [(r["phase"], r["floor_s"], r["time_over_floor"]) for r in rep.rows] == [
        ("prefill", 0.00168, 85.7), ("decode", 0.00501, 25.5)]
    md = markdown(rep)
    assert "| floor_s | time_over_floor |" in md and "| 0.00168 | 85.7 |" in md and "| 25.5 |" in md
    assert list(csv.DictReader(io.StringIO(csv_text(rep))))[1]["floor_s"] == "0.00501"


def test_bad_record_fails_with_one_line_and_writes_nothing(records_file, tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text(records_file.read_text() + "[1, 2]\n")          # JSON, but not a record object
    out = tmp_path / "out"
    p = salactl("report", str(bad), "--out", str(out))
    assert p.returncode == DatasetError.exit_code            # a bad input file: exit 7, as --calib's
    assert "bad.jsonl:7" in p.stderr and p.stderr.strip().count("\n") == 0
    assert not out.exists() or not any(out.iterdir())
    old = tmp_path / "old.jsonl"
    old.write_text(json.dumps({**RECORDS[0], "schema_version": 99}))
    assert "schema_version" in salactl("report", str(old)).stderr
    assert salactl("report", str(old), "--format", "pdf").returncode == UsageError.exit_code   # the option first


def one_error_line(p, code):
    assert p.returncode == code, (p.returncode, p.stderr)
    assert p.stderr.startswith("error: ") and p.stderr.strip().count("\n") == 0, p.stderr
    return p.stderr


def test_directory_in_place_of_a_report_changes_nothing(records_file, tmp_path):
    out = tmp_path / "out"
    (out / "report.html").mkdir(parents=True)
    (out / "report.md").write_text("old md")
    err = one_error_line(salactl("report", str(records_file), "--out", str(out), "--overwrite"),
                         UsageError.exit_code)
    assert "report.html is a directory" in err
    assert sorted(p.name for p in out.iterdir()) == ["report.html", "report.md"]     # no temps, no csv
    assert (out / "report.md").read_text() == "old md"


def test_existing_report_needs_overwrite(records_file, tmp_path):
    out = tmp_path / "out"
    assert salactl("report", str(records_file), "--out", str(out)).returncode == 0
    (out / "report.csv").write_text("mine")
    err = one_error_line(salactl("report", str(records_file), "--out", str(out), "--format", "csv,md"),
                         OutputExistsError.exit_code)
    assert str(out / "report.csv") in err and "--overwrite" in err
    assert (out / "report.csv").read_text() == "mine"
    p = salactl("report", str(records_file), "--out", str(out), "--overwrite", "--format", "csv")
    assert p.returncode == 0, p.stderr
    assert (out / "report.csv").read_text().startswith("label,")
    assert sorted(p.name for p in out.iterdir()) == ["report.csv"]     # the earlier report's md and html removed


@pytest.mark.parametrize("case", ["proc", "below_a_file"])
def test_unwritable_out_is_a_usage_error(records_file, tmp_path, case):
    out = unwritable_out(tmp_path, case)
    err = one_error_line(salactl("report", str(records_file), "--out", out), UsageError.exit_code)
    assert "--out" in err


def test_write_all_checks_every_destination_first(tmp_path):
    (tmp_path / "b").mkdir()
    (tmp_path / "a").write_text("old a")
    with pytest.raises(UsageError, match="is a directory"):
        write_all({tmp_path / "a": "new a", tmp_path / "b": "new b"})
    with pytest.raises(OutputExistsError, match="--overwrite"):
        write_all({tmp_path / "c": "c", tmp_path / "a": "new a"}, overwrite=False)
    assert (tmp_path / "a").read_text() == "old a" and sorted(p.name for p in tmp_path.iterdir()) == ["a", "b"]


def test_a_rename_failing_midway_restores_what_it_replaced(tmp_path, monkeypatch):
    """The second rename fails (as a full disk or a vanished directory would make it): the first
    file is put back as it was, the new one is removed, and no temp or backup file remains."""
    (tmp_path / "a").write_text("old a")
    real_replace, renames = os.replace, []

    def replace(src, dst):
        if str(src).endswith(".tmp"):
            renames.append(dst)
            if len(renames) == 2:
                raise OSError(28, "No space left on device", str(dst))
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", replace)
    with pytest.raises(OutputWriteError, match="No space"):
        write_all({tmp_path / "a": "new a", tmp_path / "b": "new b", tmp_path / "c": "new c"})
    monkeypatch.undo()
    assert (tmp_path / "a").read_text() == "old a"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a"]
    (tmp_path / "b").write_text("old b")
    write_all({tmp_path / "a": "new a", tmp_path / "b": "new b"})
    assert [(tmp_path / n).read_text() for n in "ab"] == ["new a", "new b"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a", "b"]


def test_format_without_out_prints_csv_or_refuses_html(records_file):
    r = salactl("report", "latency", str(records_file), "--format", "csv")
    assert r.returncode == 0 and r.stdout.startswith("label,"), r.stdout
    r = salactl("report", "latency", str(records_file), "--format", "html")
    assert r.returncode == 2 and "--format html needs --out DIR" in r.stderr


def bench_result(rid, start, ttft, latency, out, itl):
    from salactl.bench.requests import RequestResult

    return RequestResult(rid, "P", 10, out, start_time=start, success=True, ttft=ttft,
                         latency=latency, output_len=out, itl=itl)


def test_every_metric_the_bench_writes_is_reported(tmp_path):
    """F1: every numeric field of phase_metrics / one_batch_metrics (p95_tpot_ms among them) is a
    report column, in md, csv and --json."""
    from salactl.bench.metrics import one_batch_metrics, phase_metrics
    from salactl.reports.records import METRICS

    results = [bench_result("a", 0.0, 0.1, 0.5, 5, [0.1] * 4), bench_result("b", 0.2, 0.3, 0.9, 4, [0.2] * 3)]
    metrics = phase_metrics(results, 1.0, {"ttft": 500.0, "tpot": 200.0})
    metrics.update(one_batch_metrics(results, 1.0, 2, 10, 5))
    numeric = [k for k, v in metrics.items() if isinstance(v, (int, float)) and not isinstance(v, bool)
               and k not in ("batch_size", "input_len", "output_len")]          # phase settings (knobs)
    assert "p95_tpot_ms" in numeric
    assert [k for k in numeric if k not in METRICS] == []
    p = tmp_path / "r.jsonl"
    p.write_text(json.dumps({**RECORDS[0], "p95_tpot_ms": 12.5, "short_outputs": 0}) + "\n")
    res = salactl("report", "latency", str(p), "--json")
    assert res.returncode == 0, res.stderr
    d = json.loads(res.stdout)
    assert "p95_tpot_ms" in d["metrics"] and d["rows"][0]["p95_tpot_ms"] == 12.5
    assert "short_outputs" in d["metrics"]
    csv_row = next(csv.DictReader(io.StringIO(salactl("report", str(p), "--format", "csv").stdout)))
    assert csv_row["p95_tpot_ms"] == "12.5"
    assert "p95_tpot_ms" in salactl("report", str(p)).stdout


@pytest.mark.parametrize("cmd", [("report", "latency"), ("report", "memory", "--records")])
def test_non_utf8_records_file_is_a_one_line_input_error(tmp_path, cmd):
    """F2: undecodable bytes give one line naming file:line and exit 7, and nothing is written."""
    bad = tmp_path / "binary.jsonl"
    bad.write_bytes(json.dumps(RECORDS[0]).encode() + b"\n\xff\xfe garbage\n")
    out = tmp_path / "out"
    args = (*cmd, str(bad)) + (("--out", str(out)) if cmd[1] == "latency" else ())
    err = one_error_line(salactl(*args), DatasetError.exit_code)
    assert f"{bad}:2" in err and "UTF-8" in err
    assert not out.exists()


@pytest.mark.parametrize("line", [
    {"schema_version": 1, "kind": "bench", "phase": "S1"},
    {"schema_version": 1, "kind": "bench", "phase": "S1", "mean_ttft_ms": "fast"},
    {"schema_version": 1, "kind": "bench", "phase": "S1", "mean_ttft_ms": float("nan")},
    {"schema_version": 1, "kind": "bench", "phase": "S1", "mean_ttft_ms": float("inf"), "completed": True},
])
def test_records_without_a_usable_metric_are_an_error(tmp_path, line):
    """F3: no record with a known metric as a finite number: one line, exit 7, nothing written."""
    p = tmp_path / "r.jsonl"
    p.write_text(json.dumps(line) + "\n")            # json.dumps writes NaN / Infinity as Python does
    out = tmp_path / "out"
    err = one_error_line(salactl("report", "latency", str(p), "--out", str(out)), DatasetError.exit_code)
    assert f"{p}:1" in err and "finite number" in err
    assert not out.exists()


def test_unusable_records_and_values_are_skipped_with_a_warning(tmp_path):
    """F3: with some usable rows, the bad rows are skipped and bad values dropped, each named on stderr."""
    p = tmp_path / "r.jsonl"
    p.write_text("\n".join(json.dumps(r) for r in (
        RECORDS[0],
        {"schema_version": 1, "kind": "bench", "phase": "main"},
        {**RECORDS[3], "mean_ttft_ms": float("nan"), "p99_ttft_ms": "slow"},
        {"schema_version": 1, "kind": "bench", "phase": "main", "mean_ttft_ms": "fast"})) + "\n")
    res = salactl("report", "latency", str(p), "--json")
    assert res.returncode == 0, res.stderr
    warnings = res.stderr.strip().splitlines()
    assert all(w.startswith("warning: ") for w in warnings), res.stderr
    assert any(f"{p}:2" in w and f"{p}:4" in w and "skipped 2" in w for w in warnings), res.stderr
    assert any(f"{p}:3" in w and "mean_ttft_ms" in w and "p99_ttft_ms" in w for w in warnings), res.stderr
    rows = json.loads(res.stdout)["rows"]
    assert [r["label"] for r in rows] == ["bf16", "w4a16+fp8"]
    assert rows[1]["mean_ttft_ms"] is None and rows[1]["p99_ttft_ms"] is None
    assert rows[1]["median_ttft_ms"] == 37.0
    recs = load_records([p])                                     # the Python API agrees
    assert len(recs) == 2 and recs[1]["p99_ttft_ms"] is None


def test_csv_keeps_integer_columns_integer_when_some_rows_lack_them(tmp_path):
    """F6: an int column with a missing value stays int in the CSV (1, 8, empty), not 1.0, 8.0."""
    from salactl.reports.render_text import csv_text

    recs = [record("b", "S1", 1, duration=1.5, completed=12, max_concurrent_requests=1),
            record("b", "S8", 8, duration=2.5, completed=36, max_concurrent_requests=8),
            record("b", "Smax", None, duration=4.0, completed=96)]
    p = tmp_path / "r.jsonl"
    p.write_text("\n".join(json.dumps(r) for r in recs) + "\n")
    rows = list(csv.DictReader(io.StringIO(csv_text(build(load_records([p]))))))
    assert [r["knob.max_concurrency"] for r in rows] == ["1", "8", ""]
    assert [r["max_concurrent_requests"] for r in rows] == ["1", "8", ""]
    assert [r["completed"] for r in rows] == ["12", "36", "96"]
    assert [r["duration"] for r in rows] == ["1.5", "2.5", "4.0"]


@pytest.mark.parametrize("args, named", [
    (["--no-plots"], "--no-plots"),                            # no --out: no HTML
    (["--overwrite"], "--overwrite"),                          # no --out: nothing to overwrite
    (["--title", "T", "--format", "csv"], "--title"),          # CSV has no heading
    (["--out", "OUT", "--format", "md,csv", "--no-plots"], "--no-plots"),
])
def test_options_that_would_be_ignored_are_usage_errors(records_file, tmp_path, args, named):
    r = salactl("report", "latency", str(records_file), *[str(tmp_path / a) if a == "OUT" else a for a in args])
    assert r.returncode == UsageError.exit_code and r.stdout == "", r.stderr
    (line,) = r.stderr.strip().splitlines()
    assert line.startswith(f"error: {named} applies to"), line
    assert not (tmp_path / "OUT").exists()


def test_report_help_names_the_shortcut_and_h_is_no_help_option(records_file):
    r = salactl("report", "--help")
    assert r.returncode == 0 and "`salactl report FILE.jsonl ...` is short for" in " ".join(r.stdout.split())
    assert "<records.jsonl>" in salactl("report", "latency", "--help").stdout
    r = salactl("report", "-h")
    assert r.returncode == UsageError.exit_code and "No such option: -h" in r.stderr

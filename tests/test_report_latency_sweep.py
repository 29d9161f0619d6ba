"""`salactl report latency` over `salactl sweep` records: one table per sweep run with a row per grid
point ordered by the knobs that vary, with the sweep's accuracy proxies and cache size (Markdown,
CSV, HTML and --json), bench/run records beside them still per phase; and a missing records file is
an input error (exit 7), as other missing input files are."""

import csv
import io
import json
import subprocess
import sys

import pytest

from conftest import run_cli
from salactl.errors import DatasetError
from salactl.reports import plots
from salactl.reports.latency import build
from salactl.reports.records import load_records
from salactl.reports.render_html import render
from salactl.reports.render_text import csv_text, markdown

ENV = {"git_sha": "2aa7181", "git_dirty": False, "torch": "2.13.0+cpu", "cpu": "x86_64", "gpu": None}


def sweep_point(label, dense_len, chunk_size, kl, passkey, ttft):
    """A record as salactl/bench/sweep_job.py writes one (its grid knobs first, then the sweep-wide ones)."""
    return {"schema_version": 1, "kind": "sweep", "run_id": f"run-{label}", "label": label, "profile": "sweep",
            "phase": f"dl{dense_len}-cs{chunk_size}", "target": "embedded", "model": "sala-nano",
            "duration": 0.05, "completed": 1, "failed": 0, "mean_ttft_ms": ttft, "mean_tpot_ms": 5.5,
            "output_throughput": 40.0, "cache_bytes_per_request": 241664, "logit_kl_mean": kl,
            "logit_kl_max": 10 * kl, "logit_kl_sparse_mean": 2 * kl, "top1_agreement": 0.96875,
            "kl_positions": 48, "kl_sparse_positions": 33, "passkey_accuracy": passkey,
            "passkey_results": [{"length": 64, "depth": 0.5, "trials": 1, "correct": 1, "accuracy": 1.0}],
            "point_key": f"{label}{dense_len}{chunk_size}",
            "knobs": {"dense_len": dense_len, "topk": 4, "window": 64, "block": 32, "chunk_size": chunk_size,
                      "batch_size": 1, "kv_dtype": "bf16", "weight_dtype": "fp32", "input_len": 40,
                      "passkey_lengths": [64], "seed": 0},
            "env": ENV}


# grid order as `sweep --dense-len 32,16 --chunk-size 16,8` measures it: not the knobs' order
SWEEP = [sweep_point("a", 32, 16, 1e-3, 1.0, 26.0), sweep_point("a", 32, 8, 2e-3, 1.0, 45.0),
         sweep_point("a", 16, 16, 3e-3, 0.5, 27.0), sweep_point("a", 16, 8, 4e-3, 0.5, 37.0)]
BENCH = {"schema_version": 1, "kind": "bench", "run_id": "b1", "label": "bench", "profile": "soar",
         "phase": "S1", "target": "embedded", "model": "sala-nano", "completed": 4, "failed": 0,
         "mean_ttft_ms": 30.0, "output_throughput": 50.0, "knobs": {"max_concurrency": 1}, "env": ENV}


def report_of(tmp_path, records):
    p = tmp_path / "records.jsonl"
    p.write_text("".join(json.dumps(r) + "\n" for r in records))
    return build(load_records([p]))


def test_a_sweep_is_one_table_with_a_row_per_point_sorted_by_its_knobs(tmp_path):
    r = report_of(tmp_path, [*SWEEP, BENCH])
    assert r.phases == ["S1"]                                  # the points are no phases of their own
    (t,) = r.sweeps
    assert (t.label, t.knobs, t.shared) == ("a", ["dense_len", "chunk_size"],
                                            {"model": "sala-nano", "target": "embedded", "run_id": "run-a"})
    assert [row["phase"] for row in t.rows] == ["dl16-cs8", "dl16-cs16", "dl32-cs8", "dl32-cs16"]
    # the point, its varying knobs, then `salactl sweep`'s columns in its order, then the other metrics
    assert t.columns[:12] == ["phase", "knob.dense_len", "knob.chunk_size", "failed", "mean_ttft_ms",
                              "mean_tpot_ms", "output_throughput", "cache_bytes_per_request", "logit_kl_mean",
                              "logit_kl_sparse_mean", "top1_agreement", "passkey_accuracy"]
    assert {"logit_kl_max", "kl_sparse_positions", "duration"} <= set(t.columns)
    assert [(row["logit_kl_mean"], row["passkey_accuracy"]) for row in t.rows] == [
        (4e-3, 0.5), (3e-3, 0.5), (2e-3, 1.0), (1e-3, 1.0)]           # exactly as recorded
    assert r.comparison_runs == {} and r.notes == []          # points are not bench phases to compare

    md = markdown(r)
    assert "## phase: S1" in md and "## sweep: a" in md and "## phase: dl" not in md
    assert ("model sala-nano; target embedded; run_id run-a; one row per point (sorted by dense_len, "
            "chunk_size)") in md
    assert ("| point | knob.dense_len | knob.chunk_size | failed | mean_ttft_ms | mean_tpot_ms | "
            "output_throughput (tok/s) | cache_bytes_per_request (B) | logit_kl_mean | logit_kl_sparse_mean | "
            "top1_agreement | passkey_accuracy |") in md
    assert "| dl16-cs8 | 16 | 8 | 0 | 37 | 5.5 | 40 | 241664 | 0.004 | 0.008 | 0.9688 | 0.5 |" in md
    bench_table = md.split("## phase: S1")[1].split("## sweep")[0]
    assert "logit_kl_mean" not in bench_table and "| bench | bench | soar |" in bench_table

    rows = list(csv.DictReader(io.StringIO(csv_text(r))))
    assert [row["phase"] for row in rows] == ["dl16-cs8", "dl16-cs16", "dl32-cs8", "dl32-cs16", "S1"]
    assert [row["logit_kl_mean"] for row in rows] == ["0.004", "0.003", "0.002", "0.001", ""]
    assert rows[0]["cache_bytes_per_request"] == "241664" and rows[0]["top1_agreement"] == "0.96875"

    html = render(r, with_plots=False)
    assert "<h2>sweep: a</h2>" in html and "<th>passkey_accuracy</th>" in html and "phase: dl" not in html


def test_each_sweep_run_gets_its_table_and_a_resumed_one_names_its_runs(tmp_path):
    resumed = {**SWEEP[2], "run_id": "run-a2"}                 # --resume measured it in a later run
    other = [{**p, "label": None, "run_id": "r9", "knobs": {**p["knobs"], "kv_dtype": kv}}
             for p, kv in ((SWEEP[0], "fp8_e5m2"), (SWEEP[0], "bf16"))]
    r = report_of(tmp_path, [SWEEP[0], SWEEP[1], resumed, *other])
    a, unlabelled = r.sweeps
    assert a.label == "a" and "run_id" not in a.shared and a.columns[:2] == ["phase", "run_id"]
    assert [row["run_id"] for row in a.rows] == ["run-a2", "run-a", "run-a"]
    assert unlabelled.label == "r9" and unlabelled.knobs == ["kv_dtype"]
    assert [row["knob.kv_dtype"] for row in unlabelled.rows] == ["bf16", "fp8_e5m2"]
    md = markdown(r)
    assert "## sweep: r9\n\nmodel sala-nano; target embedded; one row per point (sorted by kv_dtype)" in md


def test_sweep_lines_plot_a_numeric_knob_per_combination_of_the_others(tmp_path):
    knob, lines = plots.sweep_lines(report_of(tmp_path, SWEEP))
    assert knob == "dense_len"
    assert [(name, [row["knob.dense_len"] for row in rows]) for name, rows in lines] == [
        ("a (chunk_size=8)", [16, 32]), ("a (chunk_size=16)", [16, 32])]
    import matplotlib  # noqa: F401  (the [test] extra installs it: missing is a failure, not a skip)
    captions = [c for c, png in plots.sweep_run_charts(report_of(tmp_path, SWEEP)) if png.startswith(b"\x89PNG")]
    assert "sweep: logit_kl_mean vs dense_len" in captions and "sweep: passkey_accuracy vs dense_len" in captions


def test_a_real_sweep_reports_its_accuracy_and_cache_columns(tmp_path):
    """The records `salactl sweep` writes (a tiny 2x2 grid on CPU), through the CLI into every format."""
    def salactl(*args):
        return subprocess.run([sys.executable, "-m", "salactl", *map(str, args)], capture_output=True, text=True,
                              timeout=120)

    out = tmp_path / "sweep"
    p = salactl("sweep", "--device", "cpu", "--dense-len", "32,16", "--chunk-size", "16,8", "--input-len", 40,
                "--output-len", 2, "--requests", 1, "--kl-len", 48, "--passkey-lengths", 64, "--passkey-trials", 1,
                "--passkey-depths", 0.5, "--label", "tiny", "--out", out)
    assert p.returncode == 0, p.stderr
    p = salactl("report", "latency", out / "records.jsonl", "--out", tmp_path / "rep", "--format", "md,csv", "--json")
    assert p.returncode == 0, p.stderr
    d = json.loads(p.stdout)
    (t,) = d["sweeps"]
    assert d["phases"] == [] and t["label"] == "tiny" and t["knobs"][:2] == ["dense_len", "chunk_size"]
    assert [(row["knob.dense_len"], row["knob.chunk_size"]) for row in t["rows"]] == [(16, 8), (16, 16), (32, 8),
                                                                                       (32, 16)]
    recorded = {rec["phase"]: rec for rec in map(json.loads, (out / "records.jsonl").read_text().splitlines())}
    for row in t["rows"]:
        for m in ("logit_kl_mean", "top1_agreement", "passkey_accuracy", "cache_bytes_per_request"):
            assert row[m] == recorded[row["phase"]][m]
    md = (tmp_path / "rep" / "report.md").read_text()
    assert md.count("## sweep: tiny") == 1 and "## phase:" not in md and "| top1_agreement |" in md
    rows = list(csv.DictReader(io.StringIO((tmp_path / "rep" / "report.csv").read_text())))
    assert len(rows) == 4 and all(row["passkey_accuracy"] and row["logit_kl_mean"] for row in rows)


@pytest.mark.parametrize("cmd", [("report", "latency"), ("report",), ("report", "memory", "--records")])
def test_a_missing_records_file_is_an_input_error(tmp_path, capsys, cmd):
    missing = tmp_path / "none.jsonl"
    code, out, err = run_cli([*cmd, missing], capsys)
    assert code == DatasetError.exit_code == 7 and out == "", err
    assert err.strip() == f"error: records file {missing} does not exist"

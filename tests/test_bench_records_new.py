"""Records files that were damaged by something else, sweep --resume across labels, and the bench
table's prompt lengths after --scale."""

import json
import os
import subprocess
import sys

from salactl.bench.records import RecordWriter, read_records
from salactl.bench.summary import table_rows
from salactl.bench.sweep_job import SweepSettings, run_sweep


def salactl(*args, timeout=120):
    return subprocess.run([sys.executable, "-m", "salactl", *args], capture_output=True, text=True,
                          timeout=timeout, env=dict(os.environ))


def test_a_record_after_a_truncated_last_line_starts_its_own_line(tmp_path, capsys):
    path = tmp_path / "records.jsonl"
    path.write_text('{"phase": "S1"}\n{"phase": "S8", "dur')         # cut short mid-record
    RecordWriter(path).append({"phase": "Smax"})
    lines = path.read_text().splitlines()
    assert lines == ['{"phase": "S1"}', '{"phase": "S8", "dur', '{"phase": "Smax"}']
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{path} ends in a partial line (line 2" in err
    RecordWriter(path).append({"phase": "next"})                     # a whole file: no warning
    assert path.read_text().endswith('{"phase": "Smax"}\n{"phase": "next"}\n')
    assert capsys.readouterr().err == ""


def test_bench_appends_after_a_truncated_records_file(tmp_path):
    out = tmp_path / "tr"
    args = ("bench", "--profile", "soar", "--scale", "0.002", "--phases", "S1", "--num-requests", "2",
            "--out", str(out))
    assert salactl(*args).returncode == 0
    records = out / "records.jsonl"
    records.write_bytes(records.read_bytes()[:-40])
    r = salactl(*args)
    assert r.returncode == 0, r.stderr
    assert "records.jsonl ends in a partial line (line 1" in r.stderr
    lines = records.read_text().splitlines()
    assert len(lines) == 2 and json.loads(lines[1])["phase"] == "S1"


def test_read_records_warns_once_about_damaged_lines(tmp_path, capsys):
    path = tmp_path / "records.jsonl"
    path.write_text('{"kind": "sweep"}\n{"kind": "sw\n[1, 2]\n\n{"kind": "sweep"}\nnot json\n')
    assert read_records(path) == [{"kind": "sweep"}, {"kind": "sweep"}]
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"skipped 3 damaged line(s) of {path} (first: line 2)" in err


def test_sweep_resume_reuses_only_points_of_the_same_label(tmp_path, capsys):
    settings = dict(device="cpu", input_len=8, output_len=2, requests=1, kl=False, passkey=False, out=tmp_path)
    first = run_sweep(SweepSettings(**settings, label="swA")).to_dict()
    assert first["label"] == "swA" and first["resumed_points"] == 0
    other = run_sweep(SweepSettings(**settings, label="swB", resume=True)).to_dict()
    assert other["label"] == "swB" and other["resumed_points"] == 0
    assert [p["label"] for p in other["points"]] == ["swB"]
    assert "1 point(s) recorded under another --label are measured again for --label swB" in capsys.readouterr().err
    summary = json.loads((tmp_path / f"{other['run_id']}-sweep.json").read_text())
    assert summary["label"] == "swB"
    again = run_sweep(SweepSettings(**settings, label="swA", resume=True)).to_dict()
    assert again["resumed_points"] == 1 and again["points"][0]["run_id"] == first["run_id"]
    assert [json.loads(x)["label"] for x in (tmp_path / "records.jsonl").read_text().splitlines()] == ["swA", "swB"]


def test_bench_table_shows_the_prompt_lengths_that_ran():
    scaled = {"phase": "prefill-in32768", "max_concurrency": 1, "completed": 1, "failed": 0,
              "knobs": {"dataset": {"kind": "random", "scale": 0.01, "input_len": 328, "output_len": 1}}}
    cols, rows = table_rows({"phases": [scaled]})
    assert rows[0][cols.index("in tok")] == 328 and rows[0][cols.index("out tok")] == 1
    soar = {"phase": "S1", "knobs": {"dataset": {"kind": "soar-synthetic", "scale": 0.002}}}
    cols, _ = table_rows({"phases": [soar]})
    assert "in tok" not in cols                          # mixed lengths: no single value to show

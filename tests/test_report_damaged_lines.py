"""`report latency` on a records file with a line cut short (a full disk or a crash mid-append, in a
file written before appends were all-or-nothing): the line is skipped with one warning, as bench and
sweep skip it, and only a file with no record left is an error."""

import csv
import io
import json

from salactl.errors import DatasetError

from conftest import run_cli
from test_report_latency_records import rec

TORN = '{"schema_version": 1, "kind": "run", "run_id": "r2", "phase": "pre'


def test_a_torn_line_is_skipped_with_one_warning_naming_the_file_and_line(tmp_path, capsys):
    path = tmp_path / "records.jsonl"
    path.write_text(json.dumps(rec("a", "S1", mean_ttft_ms=10.0)) + "\n" + TORN + "\n"
                    + json.dumps(rec("a", "S8", mean_ttft_ms=20.0)) + "\n" + TORN + "\n")
    code, out, err = run_cli(["report", "latency", path, "--format", "csv"], capsys)
    assert code == 0, err
    assert err.strip().splitlines() == [f"warning: skipped 2 damaged line(s) of {path} (first: line 2)"]
    assert [row["phase"] for row in csv.DictReader(io.StringIO(out))] == ["S1", "S8"]


def test_a_file_of_damaged_lines_only_is_still_an_error(tmp_path, capsys):
    path = tmp_path / "records.jsonl"
    path.write_text(TORN + "\n")
    code, out, err = run_cli(["report", "latency", path], capsys)
    assert code == DatasetError.exit_code and out == ""
    (line,) = err.strip().splitlines()
    assert line.startswith(f"error: {path}:1 is not valid JSON (") and line.endswith("each line must be one "
                                                                                  "record object")

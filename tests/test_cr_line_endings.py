"""Files saved with CR-only (old Mac) or CRLF line endings read as their lines: a raw CR cannot be
inside a JSON string, so in JSONL (bench --dataset, quantize --calib, records files) "\\r\\n", "\\r"
and "\\n" each end a line, and U+2028/U+2029/U+0085 still do not. Records files are read as they
come, a CRLF pair split between two reads of a pipe ending one line, with the 64 MiB line cap. A
plain-text --calib file calibrates on the same text whatever the editor's line endings."""

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from conftest import run_cli
from salactl.bench.datasets import read_soar_rows
from salactl.errors import DatasetError
from salactl.quant.calibration import calibration_windows, read_documents
from salactl.runtime.loader import EMBEDDED_DIR
from salactl.runtime.tokenizer import Tokenizer

ENV = {"gpu": "NVIDIA H200", "git_sha": "0123abc", "torch": "2.11.0"}


def salactl(*args, timeout=300):
    return subprocess.run([sys.executable, "-m", "salactl", *map(str, args)], capture_output=True, text=True,
                          timeout=timeout)


def record(phase: str, ttft: float = 10.0) -> str:
    """One bench phase record line, without its line end (salactl/bench/records.py make_record)."""
    return json.dumps({"schema_version": 1, "kind": "bench", "run_id": "a-1", "label": "a", "profile": "decode",
                       "phase": phase, "target": "embedded", "model": "sala-nano",
                       "timestamp": "2026-12-05T08:11:18.334674+00:00", "completed": 3, "failed": 0,
                       "mean_ttft_ms": ttft, "knobs": {"max_concurrency": 1}, "env": ENV})


def phases_in(csv: str) -> list[str]:
    header, *rows = csv.splitlines()
    column = header.split(",").index("phase")
    return [row.split(",")[column] for row in rows]


# ---------------------------------------------------------------- bench --dataset
def test_bench_runs_every_row_of_a_cr_only_dataset(tmp_path):
    data = tmp_path / "cr.jsonl"
    data.write_bytes("".join(json.dumps({"question": f"What is {i}+{i}? Tell me", "model_response": "a b c d"})
                             + "\r" for i in range(3)).encode())
    r = salactl("bench", "--model", "sala-nano", "--random-weights", "--device", "cpu", "--dtype", "float32",
                "--dataset", data, "--phases", "S1", "--out", tmp_path / "runs", "--json")
    assert r.returncode == 0, r.stderr
    (phase,) = json.loads(r.stdout)["phases"]
    assert phase["completed"] == 3 and phase["failed"] == 0, phase


def test_dataset_lines_end_at_cr_crlf_or_lf_but_not_at_unicode_breaks(tmp_path):
    prompts = ["para one\u2028para two", "one\u2029two", "next\x85line", "plain prompt"]
    data = tmp_path / "mixed.jsonl"
    data.write_bytes("".join(json.dumps({"question": p, "model_response": "a b c"}, ensure_ascii=False) + end
                             for p, end in zip(prompts, ["\r", "\r\n", "\n", "\r"])).encode())
    rows, report = read_soar_rows(data)
    assert [r.prompt for r in rows] == prompts and [r.line for r in rows] == [1, 2, 3, 4]
    assert report.bad_rows == 0
    data.write_bytes(data.read_bytes() + b"{oops\r" + json.dumps({"question": "q", "model_response": "r"}).encode())
    with pytest.raises(DatasetError, match=r"mixed.jsonl:5: row is not valid JSON"):
        read_soar_rows(data)


# ---------------------------------------------------------------- quantize --calib
def test_quantize_calibrates_on_a_cr_only_jsonl_file(tmp_path):
    src = (Path(__file__).resolve().parent.parent / "quant" / "gptq.py").read_text()
    calib = tmp_path / "calib.jsonl"
    calib.write_bytes("".join(json.dumps({"text": src[i:i + 800]}) + "\r" for i in range(0, 4000, 800)).encode())
    assert len(read_documents(calib)) == 5
    r = salactl("quantize", "--out", tmp_path / "q", "--nsamples", "2", "--seqlen", "16", "--calib", calib, "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["calibration"]["tokens"] == 32


@pytest.mark.parametrize("end", ["\r\n", "\r"])
def test_a_plain_text_calib_file_calibrates_the_same_whatever_its_line_endings(tmp_path, end):
    text = "".join(f"Line {i} of the calibration text, saved by some editor.\n" for i in range(40))
    unix, other = tmp_path / "unix.txt", tmp_path / "other.txt"
    unix.write_bytes(text.encode())
    other.write_bytes(text.replace("\n", end).encode())
    assert read_documents(other) == read_documents(unix) == [text]
    tok = Tokenizer(EMBEDDED_DIR)
    windows = [calibration_windows(str(p), tok, 4, 32, tok.vocab_size) for p in (unix, other)]
    assert windows[0].equal(windows[1])


# ---------------------------------------------------------------- records files
@pytest.mark.parametrize("end", ["\r", "\r\n"])
def test_report_latency_reads_a_records_file_with_cr_line_ends(tmp_path, capsys, end):
    path = tmp_path / "records.jsonl"
    path.write_bytes(("\ufeff" + "".join(record(p) + end for p in ("S1", "S8", "S32"))).encode())
    code, out, err = run_cli(["report", "latency", path, "--format", "csv"], capsys)
    assert code == 0 and err == "", err
    assert phases_in(out) == ["S1", "S8", "S32"]


def test_a_damaged_line_of_a_cr_only_records_file_is_named_by_its_line(tmp_path, capsys):
    path = tmp_path / "records.jsonl"
    path.write_bytes((record("S1") + "\r{torn\r" + record("S8") + "\r").encode())
    code, out, err = run_cli(["report", "latency", path, "--format", "csv"], capsys)
    assert code == 0 and phases_in(out) == ["S1", "S8"]
    assert err == f"warning: skipped 1 damaged line(s) of {path} (first: line 2)\n"


def test_a_records_pipe_is_read_as_it_comes_with_a_crlf_split_between_writes(tmp_path):
    """The writer pauses between a record's "\\r" and its "\\n": the reader has the first part and
    must wait for the next byte, not count the "\\n" as a line of its own (the damaged line 2 would
    be named line 3)."""
    path = tmp_path / "records.jsonl"
    os.mkfifo(path)
    proc = subprocess.Popen([sys.executable, "-m", "salactl", "report", "latency", path, "--format", "csv"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    parts = [record("S1") + "\r", "\n{torn\r", record("S8") + "\r"]

    def write():
        with open(path, "w", newline="") as writer:
            for part in parts:
                writer.write(part)
                writer.flush()
                time.sleep(0.5)

    writer = threading.Thread(target=write)
    writer.start()
    out, err = proc.communicate(timeout=120)
    writer.join()
    assert proc.returncode == 0, err
    assert phases_in(out) == ["S1", "S8"]
    assert err == f"warning: skipped 1 damaged line(s) of {path} (first: line 2)\n"


def test_a_records_pipe_with_cr_only_lines_is_read(tmp_path):
    """`tr '\\n' '\\r' < records.jsonl | salactl report latency /dev/stdin`."""
    text = "".join(record(p) + "\r" for p in ("S1", "S8"))
    r = subprocess.run([sys.executable, "-m", "salactl", "report", "latency", "/dev/stdin", "--format", "csv"],
                       input=text, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert phases_in(r.stdout) == ["S1", "S8"]


def test_a_cr_only_line_over_the_cap_is_refused_at_its_line(tmp_path):
    path = tmp_path / "records.jsonl"
    path.write_bytes((record("S1") + "\r").encode())
    with open(path, "r+b") as f:                 # a sparse tail of zeros without a line end
        f.truncate(path.stat().st_size + 65 * 2**20)
    r = salactl("report", "latency", path)
    assert r.returncode == DatasetError.exit_code, r.stderr
    assert r.stderr == (f"error: {path}:2 is over 64 MiB, longer than any record (records files are JSON lines "
                        "written by bench, sweep or run)\n")


def test_appending_after_a_torn_record_of_a_cr_only_file_names_its_line(tmp_path, capsys):
    from salactl.bench.records import RecordWriter

    path = tmp_path / "records.jsonl"
    path.write_bytes(b'{"phase": "S1"}\r{"phase": "S8"}\r\n{"phase": "Sm')        # line 3 torn
    RecordWriter(path).append({"phase": "next"})
    assert "ends in a partial line (line 3, a damaged record)" in capsys.readouterr().err

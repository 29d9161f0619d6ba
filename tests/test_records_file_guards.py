"""Records files read and appended at their edges: `report latency` on a file that is not JSON lines
(a pretty-printed --json output, an empty file) is an input error (exit 7) naming the file, never a file
silently dropped; Ctrl-C ends a wait for another writer's lock on records.jsonl with nothing
written; a first append that fails leaves neither the records file nor the directory it made."""

import contextlib
import json
import os
import signal
import threading
import time

import pytest

from salactl.bench.records import RecordWriter, interrupts_deferred
from salactl.errors import DatasetError, OutputWriteError

from conftest import run_cli
from test_output_write_failures import RUN, error_line, salactl_with_file_limit
from test_report_latency_records import rec

RECORD = rec("a", "S1", mean_ttft_ms=10.0)


@pytest.fixture
def run_outputs(tmp_path, capsys):
    """A real `salactl run --json --out D`: (its pretty-printed JSON document, D/records.jsonl)."""
    code, out, err = run_cli([*RUN, "--json", "--out", tmp_path / "D"], capsys)
    assert code == 0, err
    doc = tmp_path / "run1.json"
    doc.write_text(out)
    return doc, tmp_path / "D" / "records.jsonl"


def report_error(capsys, *files) -> str:
    code, out, err = run_cli(["report", "latency", *files, "--format", "csv"], capsys)
    assert code == DatasetError.exit_code and out == "", (code, err)       # an input file error, as --calib's
    (line,) = err.strip().splitlines()
    return line


def test_a_json_document_is_named_as_one_alone_or_beside_a_records_file(run_outputs, capsys):
    doc, records = run_outputs
    assert doc.read_text().count("\n") > 10                 # pretty-printed, over many lines
    expected = (f"error: {doc} is a JSON document, not JSON lines (one record object per line); give the "
                "records.jsonl that bench, sweep or run --out DIR append to")
    assert report_error(capsys, doc) == expected
    assert report_error(capsys, records, doc) == expected   # not dropped with a warning, exit 0


def test_a_file_whose_first_line_is_not_json_is_an_error_even_with_records_after_it(tmp_path, capsys):
    path = tmp_path / "notes.jsonl"
    path.write_text("# my runs\n" + json.dumps(RECORD) + "\n")
    line = report_error(capsys, path)
    assert line.startswith(f"error: {path}:1 is not valid JSON (") and line.endswith("each line must be one "
                                                                                  "record object")


def test_an_empty_records_file_beside_a_valid_one_is_an_error(tmp_path, capsys):
    good, empty = tmp_path / "records.jsonl", tmp_path / "empty.jsonl"
    good.write_text(json.dumps(RECORD) + "\n")
    empty.write_text("\n")
    assert report_error(capsys, good, empty) == (f"error: no records in {empty}; records files are the "
                                                 "records.jsonl that bench, sweep or run --out DIR append to")


@contextlib.contextmanager
def another_writer_holds_the_lock(path):
    """flock `path` through a second open file, as another process's append does; SIGINT this (main)
    thread after 0.3 s, and let go of the lock after 60 s whatever happens."""
    fcntl = pytest.importorskip("fcntl")
    fd = os.open(path, os.O_RDWR)
    fcntl.flock(fd, fcntl.LOCK_EX)
    interrupt = threading.Timer(0.3, signal.pthread_kill, (threading.main_thread().ident, signal.SIGINT))
    release = threading.Timer(60, fcntl.flock, (fd, fcntl.LOCK_UN))
    interrupt.start()
    release.start()
    try:
        yield
    finally:
        for timer in (interrupt, release):
            timer.cancel()
            timer.join()
        os.close(fd)


@pytest.mark.parametrize("deferred_by_caller", [False, True], ids=["run", "bench-and-sweep"])
def test_ctrl_c_ends_a_wait_for_another_writers_lock_with_nothing_written(tmp_path, deferred_by_caller):
    """`run` appends as it is; bench and sweep append inside their own interrupts_deferred block."""
    handler = signal.getsignal(signal.SIGINT)              # KeyboardInterrupt (Python's, or the CLI's)
    path = tmp_path / "records.jsonl"
    path.write_text(json.dumps(RECORD) + "\n")
    before = path.read_bytes()
    start = time.monotonic()
    with another_writer_holds_the_lock(path), pytest.raises(KeyboardInterrupt):
        with interrupts_deferred() if deferred_by_caller else contextlib.nullcontext():
            RecordWriter(path).append(rec("a", "S8", mean_ttft_ms=20.0))
    assert time.monotonic() - start < 30                    # not after the lock was let go (60 s)
    assert path.read_bytes() == before
    assert signal.getsignal(signal.SIGINT) is handler


def test_a_failed_first_append_leaves_neither_the_records_file_nor_its_new_directory(tmp_path):
    out = tmp_path / "r4" / "sub"
    r = salactl_with_file_limit(100, *RUN, "--out", out)   # a record is ~1 KB
    assert r.returncode == OutputWriteError.exit_code, r.stderr
    assert error_line(r.stderr) == (f"error: cannot append to {out / 'records.jsonl'}: File too large; the file "
                                    "reached a size limit of its file system or of this process (ulimit -f); "
                                    "choose another --out")
    assert os.listdir(tmp_path) == []

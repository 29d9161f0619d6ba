"""What Windows does differently, checked on Linux: a directory cannot be renamed onto an existing
one (quantize --overwrite), text-mode writes turn "\\n" into os.linesep (CSV and other outputs), and
the only file lock is msvcrt.locking, a byte-range lock (two sweeps on one --out, parallel appends).
The Windows process probe (runtime/checkpoint_write.py _windows_process_alive) needs Windows itself."""

import fcntl
import json
import os
import pathlib
import signal
import subprocess
import sys
import threading
import time

import pytest

from conftest import run_cli
from salactl.bench.records import DETAIL_COLUMNS, write_details
from salactl.reports.atomic import _byte_lock, write_all, write_atomic
from test_hygiene_checkpoint_swap import _save, _version


@pytest.fixture
def windows_rename(monkeypatch):
    """os.replace as MoveFileExW(MOVEFILE_REPLACE_EXISTING) does it: never onto a directory."""
    real_replace = os.replace

    def replace(src, dst):
        if os.path.isdir(dst):
            raise PermissionError(13, "Access is denied", str(src), None, str(dst))
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", replace)


@pytest.fixture
def windows_text_mode(monkeypatch):
    """A text-mode write as on Windows: "\\n" is written as "\\r\\n" unless `newline` says otherwise
    (the C io module fixes that at build time, so os.linesep alone does not change it on Linux)."""
    real_write_text = pathlib.Path.write_text

    def write_text(self, data, encoding=None, errors=None, newline=None):
        return real_write_text(self, data, encoding, errors, "\r\n" if newline is None else newline)

    monkeypatch.setattr(os, "linesep", "\r\n")
    monkeypatch.setattr(pathlib.Path, "write_text", write_text)


def test_overwrite_renames_the_old_checkpoint_to_a_name_that_does_not_exist_yet(tmp_path, windows_rename):
    out = _save(tmp_path / "ckpt", "old")
    _save(out, "new", overwrite=True)
    assert _version(out) == "new"
    assert [p.name for p in tmp_path.iterdir()] == ["ckpt"]             # no backup left behind


def test_outputs_are_written_byte_for_byte_as_given(tmp_path, windows_text_mode):
    write_atomic(tmp_path / "a.md", "# a\n\nb\n")
    write_all({tmp_path / "b.json": "{}\n", tmp_path / "c.csv": "x\n1\n"})
    assert [(tmp_path / n).read_bytes() for n in ("a.md", "b.json", "c.csv")] == [b"# a\n\nb\n", b"{}\n", b"x\n1\n"]


def test_details_csv_ends_lines_in_a_line_feed_only(tmp_path, windows_text_mode):
    path = tmp_path / "details.csv"
    write_details(path, [["r1", "S1", 0, 8, 4, 4, 1, 0.0, 1.5, 0.25, 2.5, "[0.25]", ""]])
    assert path.read_bytes() == (",".join(DETAIL_COLUMNS) + '\nr1,S1,0,8,4,4,1,0.0,1.5,0.25,2.5,[0.25],\n').encode()


def test_report_csv_ends_lines_in_a_line_feed_only(tmp_path, windows_text_mode, capsys):
    records = tmp_path / "records.jsonl"
    records.write_bytes(b"".join(json.dumps(
        {"schema_version": 1, "kind": "bench", "run_id": f"r{i}", "label": f"l{i}", "profile": "soar",
         "phase": "S1", "target": "embedded", "model": "m", "completed": 1, "failed": 0,
         "mean_ttft_ms": 1.0 + i, "knobs": {}, "env": {}}).encode() + b"\n" for i in range(2)))
    code, _, err = run_cli(["report", "latency", records, "--out", tmp_path / "rep", "--format", "csv"], capsys)
    assert code == 0, err
    (csv_file,) = (tmp_path / "rep").glob("*.csv")
    data = csv_file.read_bytes()
    assert b"\r" not in data and data.count(b"\n") == 3 and data.endswith(b"\n")


# msvcrt.locking's contract, by a POSIX byte-range lock: lock (or unlock) nbytes at the file's position,
# never waiting, an OSError (EACCES/EAGAIN) while another process holds them. Unlike Windows' locks,
# POSIX ones belong to the process, so the other holder must be another process.
def lockf(fd, mode, nbytes):
    fcntl.lockf(fd, mode, nbytes, 0, os.SEEK_CUR)


LOCK, UNLOCK = fcntl.LOCK_EX | fcntl.LOCK_NB, fcntl.LOCK_UN


@pytest.fixture
def held_elsewhere(tmp_path):
    """Another process holds the byte lock on `lock` until the test writes a line to it."""
    path = tmp_path / "lock"
    code = ("import fcntl, os, sys\n"
            "from test_windows_paths import _byte_lock, lockf, LOCK, UNLOCK\n"
            f"with _byte_lock({str(path)!r}, True, False, lockf, LOCK, UNLOCK):\n"
            "    print('held', flush=True)\n"
            "    sys.stdin.readline()\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(pathlib.Path(__file__).parent), *sys.path])}
    holder = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True, env=env)
    try:
        assert holder.stdout.readline() == "held\n"
        yield path, holder
    finally:
        holder.kill()
        holder.wait()


def test_a_lock_held_elsewhere_refuses_at_once_or_is_waited_for(held_elsewhere):
    path, holder = held_elsewhere
    path.write_bytes(b"data")                       # the locked byte is past it: a file's data stays usable
    with pytest.raises(BlockingIOError):
        with _byte_lock(path, False, False, lockf, LOCK, UNLOCK):
            pass
    start = time.monotonic()                        # before the timer: a stall between them cannot shorten the wait
    threading.Timer(0.3, holder.communicate, ("\n",)).start()
    with _byte_lock(path, True, True, lockf, LOCK, UNLOCK):
        assert time.monotonic() - start >= 0.25
        assert path.read_bytes() == b"data"
    assert not path.exists()                        # remove: deleted once let go (closed first)


def test_an_interrupt_ends_the_wait(held_elsewhere):
    path, _ = held_elsewhere
    threading.Timer(0.2, os.kill, (os.getpid(), signal.SIGINT)).start()
    with pytest.raises(KeyboardInterrupt):
        with _byte_lock(path, True, False, lockf, LOCK, UNLOCK):
            pass

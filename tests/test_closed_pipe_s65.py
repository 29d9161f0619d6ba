"""A stdout whose reader goes away (`salactl run --out DIR ... | head -1`) or that cannot take the text
(a full disk) costs a run none of its records: the run finishes, its prefill and decode records are
written, and the command then ends with the stream's exit code: 141 in silence, or 16 with one line."""

import json
import os
import subprocess
import sys

import pytest


def salactl_into_a_closed_pipe(*args) -> subprocess.CompletedProcess:
    """`salactl ARGS` with stdout a pipe whose reader is gone before the first write."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        return subprocess.run([sys.executable, "-m", "salactl", *map(str, args)], stdout=write_end,
                              stderr=subprocess.PIPE, text=True, timeout=300)
    finally:
        os.close(write_end)


def test_run_out_writes_its_records_when_stdouts_reader_is_gone(tmp_path):
    out = tmp_path / "r"
    r = salactl_into_a_closed_pipe("run", "-p", "def f(x):", "-n", 4, "--ignore-eos", "--device", "cpu",
                                   "--no-op-profile", "--out", out)
    assert r.returncode == 141 and "Traceback" not in r.stderr and "error" not in r.stderr, r.stderr
    records = [json.loads(line) for line in (out / "records.jsonl").read_text().splitlines()]
    assert [x["phase"] for x in records] == ["prefill", "decode"]
    assert {x["total_output_tokens"] for x in records} == {4}       # the whole run, not its first token


def test_run_without_out_still_ends_at_once_with_141(tmp_path):
    r = salactl_into_a_closed_pipe("run", "-p", "def f(x):", "-n", 4, "--device", "cpu", "--no-op-profile")
    assert r.returncode == 141 and r.stderr == "", r.stderr


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="no /dev/full")
def test_run_out_writes_its_records_when_stdout_is_full(tmp_path):
    out = tmp_path / "r"
    with open("/dev/full", "w") as full:
        r = subprocess.run([sys.executable, "-m", "salactl", "run", "-p", "def f(x):", "-n", "4", "--ignore-eos",
                            "--device", "cpu", "--no-op-profile", "--out", str(out)], stdout=full,
                           stderr=subprocess.PIPE, text=True, timeout=300)
    assert r.returncode == 16, r.stderr
    assert r.stderr.strip().splitlines()[-1].startswith("error: cannot write to stdout: No space left on device")
    assert len((out / "records.jsonl").read_text().splitlines()) == 2

"""`salactl bench` on the embedded CPU runtime, end to end: what --json's `files` lists is what the run
wrote."""

import json
import os
import subprocess
import sys


def salactl(*args, timeout=300):
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    return subprocess.run([sys.executable, "-m", "salactl", *args], capture_output=True, text=True,
                          timeout=timeout, env=env)


def test_no_records_file_when_every_phase_is_skipped(tmp_path):
    """The reference engine runs one sequence at a time, so decode-bs8 cannot run: a run that would
    measure nothing is a config error (exit 3, tests/test_bench_cli_gaps_s66.py), and nothing is written."""
    out = tmp_path / "runs"
    r = salactl("bench", "--profile", "decode", "--phases", "decode-bs8", "--scale", "0.01", "--model", "sala-nano",
                "--random-weights", "--device", "cpu", "--dtype", "float32", "--out", str(out), "--json")
    assert r.returncode == 3, r.stderr
    assert r.stdout == ""
    assert not (out / "records.jsonl").exists()


def test_json_files_name_the_files_written(tmp_path):
    out = tmp_path / "runs"
    r = salactl("bench", "--phases", "S1", "--num-requests", "2", "--scale", "0.002", "--model", "sala-nano",
                "--random-weights", "--device", "cpu", "--dtype", "float32", "--out", str(out), "--json")
    assert r.returncode == 0, r.stderr
    files = json.loads(r.stdout)["files"]
    assert files["records"] == str(out / "records.jsonl")
    listed = [files["records"], files["summary_md"], files["summary_json"], *files["plots"]]
    assert all(os.path.isfile(p) for p in listed)

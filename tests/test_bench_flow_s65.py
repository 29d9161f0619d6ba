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


def test_json_lists_no_records_file_when_every_phase_is_skipped(tmp_path):
    """The reference engine runs one sequence at a time, so decode-bs8 is skipped: nothing is recorded,
    and --json must not name a records.jsonl that was never written."""
    out = tmp_path / "runs"
    r = salactl("bench", "--profile", "decode", "--phases", "decode-bs8", "--scale", "0.01", "--model", "sala-nano",
                "--random-weights", "--device", "cpu", "--dtype", "float32", "--out", str(out), "--json")
    assert r.returncode == 0, r.stderr
    run = json.loads(r.stdout)
    assert run["phases"] == [] and [s["phase"] for s in run["skipped_phases"]] == ["decode-bs8"]
    assert not (out / "records.jsonl").exists()
    assert run["files"] == {}


def test_json_files_name_the_files_written(tmp_path):
    out = tmp_path / "runs"
    r = salactl("bench", "--phases", "S1", "--num-requests", "2", "--scale", "0.002", "--model", "sala-nano",
                "--random-weights", "--device", "cpu", "--dtype", "float32", "--out", str(out), "--json")
    assert r.returncode == 0, r.stderr
    files = json.loads(r.stdout)["files"]
    assert files["records"] == str(out / "records.jsonl")
    listed = [files["records"], files["summary_md"], files["summary_json"], *files["plots"]]
    assert all(os.path.isfile(p) for p in listed)

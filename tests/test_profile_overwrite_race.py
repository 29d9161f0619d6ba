"""`profile --overwrite` replaces a profile in --out, also one that another process wrote there
while this one was profiling (without --overwrite that one is kept and this run exits 10:
tests/test_concurrent_writers.py)."""

import json
import os
import threading
import time

from conftest import run_cli


def test_overwrite_replaces_a_profile_written_meanwhile(tmp_path, capsys):
    out = tmp_path / "p"
    profiling = threading.Event()

    def other_profile_lands_first():
        while not profiling.is_set() and not list(tmp_path.glob(".p.tmp-*")):     # ours is staging
            time.sleep(0.005)
        out.mkdir()
        for name in ("result.json", "step.json", "profile.csv"):
            (out / name).write_text('{"theirs": true}')

    other = threading.Thread(target=other_profile_lands_first)
    other.start()
    try:
        code, _, err = run_cli(["profile", "--torch", "--phase", "decode", "--context", 16, "--warmup", 0,
                                "--out", out, "--overwrite"], capsys)
    finally:
        profiling.set()
        other.join()
    assert code == 0, err
    assert json.loads((out / "result.json").read_text())["mode"] == "torch"
    assert sorted(os.listdir(out)) == ["result.json", "step.json", "trace.json"]     # their profile.csv went too
    assert os.listdir(tmp_path) == ["p"]

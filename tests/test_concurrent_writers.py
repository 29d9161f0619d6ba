"""Two salactl writers on the same output at once: the races are made deterministic by letting
"the other process" act at the moment that matters (between a check and a rename, or while holding
the lock a writer takes). flock locks belong to an open file, so threads of one process contend
for them as processes do. The loser gets exit 10 and a whole output stays, never a mix."""

import json
import os
import threading
import time
from pathlib import Path

import pytest

from salactl.bench.records import RecordWriter
from salactl.reports.atomic import exclusive_lock
from salactl.bench.sweep_job import SWEEP_LOCK, SweepSettings, run_sweep
from salactl.errors import OutputExistsError
from salactl.reports.atomic import write_atomic
from salactl.runtime import checkpoint_write as checkpoint
from salactl.runtime.peaks import cache_path, load_measured
from salactl.runtime.peaks_measure import store_measurement

from conftest import run_cli
from test_hygiene_checkpoint_swap import _save, _version


def finishes_within(thread: threading.Thread, seconds: float) -> bool:
    thread.join(seconds)
    return not thread.is_alive()


def test_a_records_append_waits_for_the_writer_holding_the_file(tmp_path):
    """A full disk is undone by truncating to the size before the append: no other append may land
    in between, or the truncation would cut it."""
    fcntl = pytest.importorskip("fcntl")                # POSIX only, as the lock itself
    path = tmp_path / "records.jsonl"
    path.write_text('{"phase": "a"}\n')
    appending = threading.Thread(target=RecordWriter(path).append, args=({"phase": "b"},))
    with open(path, "ab") as other:
        fcntl.flock(other, fcntl.LOCK_EX)               # another process, mid-append
        appending.start()
        assert not finishes_within(appending, 0.3)
        other.write(b'{"phase": "other"}\n')
        other.flush()
        fcntl.flock(other, fcntl.LOCK_UN)
    assert finishes_within(appending, 10)
    assert path.read_text().splitlines() == ['{"phase": "a"}', '{"phase": "other"}', '{"phase": "b"}']


def test_a_checkpoint_another_process_wrote_meanwhile_is_not_replaced(tmp_path, monkeypatch):
    out = tmp_path / "ckpt"
    real_save_file = checkpoint.save_file
    raced = []

    def save_then_lose_the_race(tensors, filename, metadata=None):
        real_save_file(tensors, filename, metadata=metadata)
        if not raced:                   # ours is in its temp dir: the other save runs whole now
            raced.append(filename)
            _save(out, "theirs")

    monkeypatch.setattr(checkpoint, "save_file", save_then_lose_the_race)
    with pytest.raises(OutputExistsError, match=f"^{out} already exists: another process wrote it meanwhile; "
                                                "choose another --out or pass --overwrite$"):
        _save(out, "ours")
    monkeypatch.undo()
    assert _version(out) == "theirs"
    assert os.listdir(tmp_path) == ["ckpt"]                 # our temp dir is gone


def test_a_checkpoint_written_between_the_overwrite_renames_stays_and_is_one_error(tmp_path, monkeypatch):
    out = _save(tmp_path / "ckpt", "old")
    real_replace = os.replace
    raced = []

    def replace_then_lose_the_race(src, dst):
        real_replace(src, dst)
        if Path(src) == out and not raced:     # the old checkpoint went aside: another one lands
            raced.append(dst)
            _save(out, "theirs")

    monkeypatch.setattr(os, "replace", replace_then_lose_the_race)
    with pytest.raises(OutputExistsError, match=f"^another process wrote {out} meanwhile, and its checkpoint "
                                                "stays; run again to replace it, or choose another --out$"):
        _save(out, "ours", overwrite=True)
    monkeypatch.undo()
    assert _version(out) == "theirs"
    assert os.listdir(tmp_path) == ["ckpt"]                 # neither the backup nor our temp dir


def test_a_profile_another_process_wrote_meanwhile_is_not_replaced(tmp_path, capsys):
    out = tmp_path / "p"
    theirs = {"result.json": '{"theirs": true}', "step.json": "{}", "trace.json": "{}"}
    profiling = threading.Event()

    def other_profile_lands_first():
        while not profiling.is_set() and not list(tmp_path.glob(".p.tmp-*")):     # ours is staging
            time.sleep(0.005)
        out.mkdir()
        for name, text in theirs.items():
            (out / name).write_text(text)

    other = threading.Thread(target=other_profile_lands_first)
    other.start()
    try:
        code, _, err = run_cli(["profile", "--torch", "--phase", "decode", "--context", 16, "--warmup", 0,
                                "--out", out], capsys)
    finally:
        profiling.set()
        other.join()
    assert code == OutputExistsError.exit_code, err
    assert err.strip().splitlines()[-1] == (f"error: {out / 'result.json'} already exists; choose another "
                                            "--out or pass --overwrite")
    assert {p.name: p.read_text() for p in out.iterdir()} == theirs
    assert os.listdir(tmp_path) == ["p"]                    # no staging directory left


class PausedProgress:
    """A sweep's progress display that holds the sweep at its first point until `resume` is set."""

    def __init__(self):
        self.paused, self.resume = threading.Event(), threading.Event()

    def begin(self, name, total):
        self.paused.set()
        self.resume.wait(60)

    def advance_point(self): ...

    def end(self): ...


def test_a_second_sweep_on_the_same_out_is_refused_while_the_first_runs(tmp_path):
    """Two `sweep --resume --label L` at once would both measure the points not yet recorded."""
    out = tmp_path / "s"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    settings = SweepSettings(device="cpu", input_len=16, output_len=2, requests=1, kl=False, passkey=False,
                             out=out, resume=True, label="L")
    progress = PausedProgress()
    first: list = []
    sweeping = threading.Thread(target=lambda: first.append(run_sweep(settings, progress)))
    sweeping.start()
    try:
        assert progress.paused.wait(60)
        with pytest.raises(OutputExistsError, match=f"^another sweep is writing {out}; wait for it to end or "
                                                    "choose another --out$"):
            run_sweep(settings)
    finally:
        progress.resume.set()
        sweeping.join()
    assert len(first) == 1 and first[0].points
    assert sorted(os.listdir(out)) == sorted(["notes.txt", "records.jsonl", f"{first[0].run_id}-sweep.json"])


def test_two_devices_stored_in_the_peaks_cache_at_once_both_stay(tmp_path, monkeypatch):
    monkeypatch.setenv("SALACTL_CACHE_DIR", str(tmp_path))
    entry = {"mem_gbps": 30.0, "bf16_tflops": 0.5}
    storing = threading.Thread(target=store_measurement, args=("gpu:B", entry))
    with exclusive_lock(tmp_path / "peaks.json.lock"):      # another store, between its read and its write
        data = load_measured(warn=False)
        storing.start()
        assert not finishes_within(storing, 0.3)
        write_atomic(cache_path(), json.dumps({**data, "gpu:A": entry}))
    assert finishes_within(storing, 10)
    assert sorted(load_measured()) == ["gpu:A", "gpu:B"]
    assert os.listdir(tmp_path) == ["peaks.json"]           # the lock file goes with the last store

"""bench/sweep/run CLI gaps: a bench whose selected phases are all skipped measured nothing (exit 3,
as sweep's grid with no point to measure), an empty --label, and --scale values so large that their
sizes no longer read as numbers."""

import os
import subprocess
import sys

import pytest

from salactl.bench.job import BenchSettings, run_bench
from salactl.bench.records import check_label
from salactl.bench.synthetic import soar_like
from salactl.errors import CapacityError, ConfigError, UsageError


def salactl(*args, timeout=120):
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    return subprocess.run([sys.executable, "-m", "salactl", *args], capture_output=True, text=True,
                          timeout=timeout, env=env)


def test_bench_with_every_phase_skipped_exits_3_before_loading(tmp_path):
    """The reference engine runs one sequence at a time, so decode-bs8 cannot run: refused before the
    model loads (a missing checkpoint would otherwise be the error), one line, no files, empty stdout."""
    out = tmp_path / "runs"
    r = salactl("bench", "--profile", "decode", "--phases", "decode-bs8", "--scale", "0.01",
                "--model", str(tmp_path / "no-such-checkpoint"), "--engine", "reference", "--out", str(out), "--json")
    assert r.returncode == 3, r.stderr
    assert r.stdout == ""
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: no phase could be measured (decode-bs8: batch 8 >")
    assert "nothing was recorded" in lines[0] and "--engine gpu" in lines[0]
    assert not out.exists() or not any(out.iterdir())


def test_bench_with_every_phase_skipped_after_loading_is_a_config_error(tmp_path, monkeypatch):
    """Where the check before loading cannot tell (a target whose batch limit only shows once it is
    built), the run that skipped every phase is still no success."""
    from salactl.bench import job

    monkeypatch.setattr(job, "_largest_batch_before_loading", lambda s: None)
    with pytest.raises(ConfigError, match=r"no phase could be measured \(decode-bs8: batch 8 > .*\); nothing"):
        run_bench(BenchSettings(profile="decode", phases=("decode-bs8",), model="sala-nano", random_weights=True,
                                device="cpu", dtype="float32", scale=0.01, engine="reference", out=tmp_path / "o"))
    assert not (tmp_path / "o" / "records.jsonl").exists()


def test_bench_runs_the_phases_it_can_when_some_are_skipped(tmp_path):
    run = run_bench(BenchSettings(profile="decode", phases=("decode-bs1", "decode-bs8"), model="sala-nano",
                                  random_weights=True, device="cpu", dtype="float32", scale=0.01,
                                  engine="reference", out=tmp_path)).to_dict()
    assert [p["phase"] for p in run["phases"]] == ["decode-bs1"]
    assert [s["phase"] for s in run["skipped_phases"]] == ["decode-bs8"]


@pytest.mark.parametrize("label", ["", " ", "\u3000"])
def test_empty_label_is_refused(label):
    with pytest.raises(UsageError, match="--label is empty"):
        check_label(label)


@pytest.mark.parametrize("command", [
    ["bench", "--phases", "S1", "--num-requests", "1", "--scale", "0.002"],
    ["sweep", "--no-kl", "--no-passkey", "--input-len", "8", "--output-len", "2", "--requests", "1"],
    ["run", "--prompt", "hi", "--max-new-tokens", "1"],
])
@pytest.mark.parametrize("label", ["", "  "])
def test_cli_refuses_an_empty_label_before_any_work(tmp_path, command, label):
    out = tmp_path / "out"
    r = salactl(*command, "--label", label, "--out", str(out), "--json")
    assert r.returncode == 2, r.stderr
    assert r.stdout == "" and r.stderr.strip().splitlines() == [
        "error: --label is empty; give a name for the records, or drop --label"]
    assert not out.exists()


def test_bench_api_refuses_an_empty_label(tmp_path):
    with pytest.raises(UsageError, match="--label is empty"):
        run_bench(BenchSettings(label="", model=str(tmp_path / "none"), out=tmp_path))


@pytest.mark.parametrize("scale", [1e30, 1e300, 1e19])
def test_scale_past_any_machine_says_so_in_readable_numbers(scale):
    with pytest.raises(CapacityError) as e:
        soar_like(12, scale, 1000)
    msg = str(e.value)
    assert "past any machine's memory; lower --scale" in msg
    assert "TiB" not in msg and max(map(len, msg.split())) < 24, msg


def test_cli_scale_1e30_is_one_readable_line(tmp_path):
    r = salactl("bench", "--scale", "1e30", "--out", str(tmp_path / "o"), "--json")
    assert r.returncode == 11, r.stderr
    line, = r.stderr.strip().splitlines()
    assert line.startswith("error: --scale 1e+30 scales a length of ") and "TiB" not in line
    assert len(line) < 200, line
    assert r.stdout == ""

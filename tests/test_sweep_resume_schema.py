"""`salactl sweep --resume` reuses only records `salactl report` reads (reports.records.validate):
one of another schema_version (a newer salactl's), without one, or with a malformed identity field
is measured again with a note, as a record lacking what the sweep reads, and its values reach
neither the points, the summary nor the Pareto front."""

import json
import subprocess
import sys

import pytest

from salactl.bench.sweep_job import SweepSettings, run_sweep

FAKE_MS = 0.001          # faster than any real point: the front would be this point alone


def salactl(*args):
    return subprocess.run([sys.executable, "-m", "salactl", *map(str, args)], capture_output=True, text=True,
                          timeout=600)


def test_a_record_of_another_schema_version_is_measured_again_not_reused(tmp_path):
    grid = ("sweep", "--device", "cpu", "--dense-len", "64,256", "--topk", 2, "--input-len", 128, "--output-len", 4,
            "--requests", 1, "--no-passkey", "--json")
    assert salactl(*grid, "--out", tmp_path / "sw1").returncode == 0
    first, second = map(json.loads, (tmp_path / "sw1" / "records.jsonl").read_text().splitlines())
    future = dict(first, schema_version=2, median_e2e_latency_ms=FAKE_MS, mean_e2e_latency_ms=FAKE_MS)
    (tmp_path / "sw2").mkdir()
    (tmp_path / "sw2" / "records.jsonl").write_text(json.dumps(future) + "\n" + json.dumps(second) + "\n")

    r = salactl(*grid, "--out", tmp_path / "sw2", "--resume")
    assert r.returncode == 0, r.stderr
    run = json.loads(r.stdout)
    assert run["resumed_points"] == 1
    assert (f"note: the record of point dl64 in {tmp_path / 'sw2' / 'records.jsonl'} is not one this salactl reads "
            "(it has schema_version 2; this salactl reads version 1); measuring it again") in r.stderr
    remeasured = {p["phase"]: p for p in run["points"]}["dl64"]
    assert remeasured["schema_version"] == 1 and remeasured["run_id"] == run["run_id"]
    assert FAKE_MS not in (remeasured["median_e2e_latency_ms"], remeasured["mean_e2e_latency_ms"])
    summary = json.loads((tmp_path / "sw2" / f"{run['run_id']}-sweep.json").read_text())
    assert all(p["schema_version"] == 1 for p in summary["points"])


@pytest.fixture(scope="module")
def one_point(tmp_path_factory):
    """A one-point sweep: (its settings, its record)."""
    out = tmp_path_factory.mktemp("one")
    settings = dict(device="cpu", input_len=16, output_len=2, requests=1, kl=False, passkey=False)
    run_sweep(SweepSettings(**settings, out=out))
    (record,) = map(json.loads, (out / "records.jsonl").read_text().splitlines())
    return settings, record


@pytest.mark.parametrize("change, why", [
    ({"schema_version": None}, "it is not a salactl record (no schema_version)"),
    ({"schema_version": "1"}, 'it has schema_version "1"'),
    ({"schema_version": True}, "it has schema_version true"),
    ({"env": "cpu"}, "it: 'env' must be an object"),
    ({"run_id": 5}, "it: 'run_id' must be a string or null, got 5"),
])
def test_a_record_report_would_refuse_is_measured_again_with_a_note(tmp_path, capsys, one_point, change, why):
    settings, record = one_point
    bad = {k: v for k, v in {**record, **change}.items() if v is not None}
    (tmp_path / "records.jsonl").write_text(json.dumps(bad) + "\n")
    run = run_sweep(SweepSettings(**settings, out=tmp_path, resume=True)).to_dict()
    assert run["resumed_points"] == 0 and run["points"][0]["run_id"] == run["run_id"]
    assert (f"note: the record of point default in {tmp_path / 'records.jsonl'} is not one this salactl reads "
            f"({why}") in capsys.readouterr().err


def test_a_record_of_this_schema_version_is_still_reused(tmp_path, one_point):
    settings, record = one_point
    (tmp_path / "records.jsonl").write_text(json.dumps(record) + "\n")
    run = run_sweep(SweepSettings(**settings, out=tmp_path, resume=True)).to_dict()
    assert run["resumed_points"] == 1 and run["points"][0]["run_id"] == record["run_id"]

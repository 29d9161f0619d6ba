"""`salactl profile --import` of the real H200 capture (tests/fixtures/ncu) with a step.json whose
profiled phases or scopes hold none of the CSV's kernels: nothing left is a usage error naming the
CSV and the scopes, a phase left empty is left out of the tables with a warning, never zeros."""

import copy
import json

import pytest

from salactl.errors import UsageError

from conftest import run_cli
from test_profile_import import fixture_manifest, ncu_profile_dir


@pytest.fixture(autouse=True)
def datasheet_peaks(tmp_path, monkeypatch):
    monkeypatch.setenv("SALACTL_CACHE_DIR", str(tmp_path / "cache"))


def test_scopes_matching_no_kernel_are_refused_not_tabled_as_zeros(tmp_path, capsys):
    manifest = fixture_manifest()
    manifest["steps"]["decode"]["scopes"] = ["layer99"]
    saved = ncu_profile_dir(tmp_path / "p", manifest)
    code, out, err = run_cli(["profile", "--import", saved, "--json"], capsys)
    assert code == UsageError.exit_code and out == "", err
    (line,) = err.strip().splitlines()
    assert str(saved / "profile.csv") in line and "(decode: layer99)" in line, line


def test_a_phase_without_kernels_is_left_out_with_a_warning(tmp_path, capsys):
    manifest = fixture_manifest()      # its CSV holds decode kernels only
    manifest["steps"] = {"prefill": copy.deepcopy(manifest["steps"]["decode"]), **manifest["steps"]}
    saved = ncu_profile_dir(tmp_path / "p", manifest)
    code, out, err = run_cli(["profile", "--import", saved, "--json"], capsys)
    assert code == 0, err
    d = json.loads(out)
    assert {r["phase"] for r in d["ops"] + d["layers"] + d["kernels"]} == {"decode"}
    assert list(d["manifest"]["steps"]) == ["decode"] and d["kernel_count"] == 420
    (warning,) = err.strip().splitlines()
    assert warning.startswith("warning: prefill: left out") and "--launch-count" in warning, err
    assert d["notes"] == [warning.removeprefix("warning: ")]
    code, out, err = run_cli(["profile", "--import", saved], capsys)
    assert code == 0 and "prefill:" not in out.replace("note: prefill: left out", ""), out

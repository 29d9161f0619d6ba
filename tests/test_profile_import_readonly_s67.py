"""`profile --import` of a saved report (profile.ncu-rep, no profile.csv) in a directory it cannot
write: ncu's export is rendered all the same, with a warning that it could not be kept, not exit 1
(read-only) or exit 16 naming an --out that --import refuses (full)."""

import gzip
import json
import shutil
import subprocess
from pathlib import Path

import pytest

from conftest import run_cli

FIXTURE = Path(__file__).parent / "fixtures" / "ncu"


@pytest.mark.parametrize("limit", ["read-only", "full"])
def test_import_renders_an_export_it_cannot_save(tmp_path, tmpfs, capsys, monkeypatch, limit):
    monkeypatch.setenv("SALACTL_CACHE_DIR", str(tmp_path / "cache"))       # datasheet ceilings
    csv = tmp_path / "export.csv"
    csv.write_bytes(gzip.decompress((FIXTURE / "profile.csv.gz").read_bytes()))
    ncu = tmp_path / "fake-ncu"                 # a stand-in ncu whose export is the fixture's CSV
    ncu.write_text(f"#!/bin/sh\ncat '{csv}'\n")
    ncu.chmod(0o755)
    mnt = tmpfs("64k")                          # room for step.json, not for the 840 KB export
    saved = mnt / "p"
    saved.mkdir()
    shutil.copy(FIXTURE / "step.json", saved / "step.json")
    (saved / "profile.ncu-rep").write_bytes(b"a report")
    if limit == "read-only":
        subprocess.run(["mount", "-o", "remount,ro", str(mnt)], check=True)
    code, out, err = run_cli(["profile", "--import", saved, "--ncu-path", ncu, "--json"], capsys)
    assert code == 0, err
    assert json.loads(out)["kernel_count"] == 420
    reason = "Read-only file system" if limit == "read-only" else "No space left on device"
    assert err.strip() == (f"warning: cannot save ncu's export as {saved / 'profile.csv'} ({reason}); the tables "
                           "are read from it unsaved, and the next --import exports it again")
    assert sorted(p.name for p in saved.iterdir()) == ["profile.ncu-rep", "step.json"]

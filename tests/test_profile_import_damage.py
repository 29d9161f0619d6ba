"""`salactl profile --import DIR` on a directory whose step.json or profile.csv is damaged or not a
file (gzip-compressed, not UTF-8, nested too deeply, a directory, a FIFO, a cost too large for a
float), or that cannot be looked up (a parent without search permission, a name too long), and
`bench --profile` on such paths: one line and exit 2 (--import) or 3 (--profile), never a
traceback, an exit 1 or a hang."""

import gzip
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from salactl.errors import ConfigError, UsageError

from conftest import run_cli
from test_bad_inputs import run_unprivileged

FIXTURE = Path(__file__).parent / "fixtures" / "ncu"
FIX = "give a directory written by salactl profile --ncu"


@pytest.fixture(autouse=True)
def datasheet_peaks(tmp_path, monkeypatch):
    monkeypatch.setenv("SALACTL_CACHE_DIR", str(tmp_path / "cache"))


def saved(path: Path) -> Path:
    """A saved ncu profile directory: the fixture's step.json and profile.csv."""
    path.mkdir(parents=True)
    shutil.copy(FIXTURE / "step.json", path / "step.json")
    (path / "profile.csv").write_bytes(gzip.decompress((FIXTURE / "profile.csv.gz").read_bytes()))
    return path


def one_line(code: int, err: str, exit_code: int) -> str:
    assert code == exit_code, err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    return err.strip()


def import_cli(args, capsys) -> str:
    code, out, err = run_cli(["profile", "--import", *args], capsys)
    assert out == ""
    return one_line(code, err, UsageError.exit_code)


def _manifest_with_huge_cost() -> bytes:
    m = json.loads((FIXTURE / "step.json").read_text())
    m["steps"]["decode"]["analytic"]["qkv"]["bytes"] = 10 ** 400     # parses; overflows a float
    return json.dumps(m).encode()


def _manifest_with_text_bf16_flops() -> bytes:
    m = json.loads((FIXTURE / "step.json").read_text())
    m["steps"]["decode"]["analytic"]["mlp"]["bf16_flops"] = "many"
    return json.dumps(m).encode()


STEP_JSON = {    # what step.json holds: the error's tail
    "gzip": (lambda: gzip.compress((FIXTURE / "step.json").read_bytes()), "is gzip-compressed; gunzip it first"),
    "latin-1": (lambda: (FIXTURE / "step.json").read_text().replace('"decode"', '"décodé"').encode("latin-1"),
                "is not UTF-8 text (byte 0xe9 at offset"),
    "deep": (lambda: b"[" * 100_000 + b"]" * 100_000, f"nests JSON arrays/objects too deeply to parse; {FIX}"),
    "huge cost": (_manifest_with_huge_cost, "is not a salactl profile manifest: steps.decode.analytic.qkv is not "
                                            f"an object with numbers bytes and flops; {FIX}"),
    "text bf16_flops": (_manifest_with_text_bf16_flops, "is not a salactl profile manifest: "
                                                        f"steps.decode.analytic.mlp.bf16_flops is not a number; {FIX}"),
}


@pytest.mark.parametrize("kind", STEP_JSON)
def test_a_damaged_step_json_is_one_line(tmp_path, capsys, kind):
    data, tail = STEP_JSON[kind]
    p = saved(tmp_path / "p")
    (p / "step.json").write_bytes(data())
    line = import_cli([p], capsys)
    assert line.startswith(f"error: {p / 'step.json'} ") and tail in line


@pytest.mark.parametrize("name", ["step.json", "profile.csv"])
def test_a_directory_in_place_of_a_file_is_one_line(tmp_path, capsys, name):
    p = saved(tmp_path / "p")
    (p / name).unlink()
    (p / name).mkdir()
    assert import_cli([p], capsys).startswith(f"error: {p / name} is not a regular file; ")


@pytest.mark.parametrize("name", ["step.json", "profile.csv"])
def test_a_fifo_in_place_of_a_file_is_refused_not_waited_on(tmp_path, name):
    if not hasattr(os, "mkfifo"):
        pytest.skip("no FIFOs here")
    p = saved(tmp_path / "p")
    (p / name).unlink()
    os.mkfifo(p / name)
    r = subprocess.run([sys.executable, "-m", "salactl", "profile", "--import", p], capture_output=True, text=True,
                       timeout=60, env={**os.environ, "SALACTL_CACHE_DIR": str(tmp_path / "cache")})
    assert one_line(r.returncode, r.stderr, UsageError.exit_code).startswith(f"error: {p / name} is not a regular "
                                                                              "file; ")


def test_an_import_name_too_long_is_one_line(tmp_path, capsys):
    p = tmp_path / ("p" * 300)
    assert import_cli([p], capsys) == f"error: cannot look up --import {p} (File name too long); give another path"


def _locked(tmp_path: Path) -> Path:
    """A directory without search permission (mode 0o600) holding a saved profile `imp` and `p.toml`."""
    locked = tmp_path / "locked"
    saved(locked / "imp")
    (locked / "p.toml").write_text('name = "x"\n')
    locked.chmod(0o600)
    return locked


def _unprivileged(args):
    r = run_unprivileged(args)
    if r is None or "Operation not permitted" in r.stderr and "setpriv" in r.stderr:
        pytest.skip("cannot drop the permission to search a chmod 600 directory here")
    return r


def test_import_below_a_directory_without_search_permission_is_one_line(tmp_path):
    locked = _locked(tmp_path)
    try:
        r = _unprivileged(["profile", "--import", locked / "imp"])
    finally:
        locked.chmod(0o700)
    assert one_line(r.returncode, r.stderr, UsageError.exit_code) == (
        f"error: cannot look up --import {locked / 'imp'} (Permission denied); fix the permissions of the "
        "directories above it")


def test_import_of_a_directory_without_search_permission_is_one_line(tmp_path):
    p = saved(tmp_path / "p")
    p.chmod(0o600)
    try:
        r = _unprivileged(["profile", "--import", p])
    finally:
        p.chmod(0o700)
    assert one_line(r.returncode, r.stderr, UsageError.exit_code) == (
        f"error: cannot read {p / 'step.json'} (Permission denied); fix its permissions")


@pytest.mark.parametrize("name", ["p.toml", "p"])
def test_a_bench_profile_below_a_directory_without_search_permission_exits_3(tmp_path, name):
    locked = _locked(tmp_path)
    try:
        r = _unprivileged(["bench", "--profile", locked / name])
    finally:
        locked.chmod(0o700)
    assert one_line(r.returncode, r.stderr, ConfigError.exit_code) == (
        f"error: cannot look up --profile {locked / name} (Permission denied); fix the permissions of the "
        "directories above it")


@pytest.mark.parametrize("suffix", [".toml", ""])
def test_a_bench_profile_name_too_long_exits_3(tmp_path, capsys, suffix):
    name = "p" * 300 + suffix                   # a bare name (no .toml) is looked up as a shipped one first
    code, out, err = run_cli(["bench", "--profile", name, "--out", tmp_path / "o"], capsys)
    assert one_line(code, err, ConfigError.exit_code) == (
        f"error: cannot look up --profile {name} (File name too long); give another path")

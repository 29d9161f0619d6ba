"""`salactl info --measure` with a SALACTL_CACHE_DIR that cannot be looked up (a name longer than
NAME_MAX, a path longer than PATH_MAX, a parent without search permission): the usage error that
names the peaks cache and SALACTL_CACHE_DIR, exit 2, one line, before measuring."""

import pytest

from salactl.errors import UsageError
from salactl.runtime.peaks import cache_path

from conftest import run_cli
from test_bad_inputs import run_unprivileged

FIX = "set SALACTL_CACHE_DIR to a writable directory"


def one_line(code: int, err: str) -> str:
    assert code == UsageError.exit_code, err
    assert "measuring" not in err and "Traceback" not in err, err
    (line,) = err.strip().splitlines()
    return line


@pytest.mark.parametrize("too_long", ["a name", "the path"])
def test_a_cache_dir_too_long_to_look_up_is_a_usage_error(tmp_path, capsys, monkeypatch, too_long):
    cache = tmp_path / ("c" * 300) if too_long == "a name" else tmp_path.joinpath(*["c" * 200] * 25)
    monkeypatch.setenv("SALACTL_CACHE_DIR", str(cache))
    code, _, err = run_cli(["info", "--measure", "--device", "cpu"], capsys)
    assert one_line(code, err) == (f"error: cannot write the peaks cache {cache_path()}: cannot look up its "
                                   f"directory: File name too long; {FIX}")


def test_a_cache_dir_below_a_directory_without_search_permission_is_a_usage_error(tmp_path, monkeypatch):
    locked = tmp_path / "locked"
    (locked / "cache").mkdir(parents=True)
    locked.chmod(0o600)
    monkeypatch.setenv("SALACTL_CACHE_DIR", str(locked / "cache"))
    try:
        r = run_unprivileged(["info", "--measure", "--device", "cpu"])
    finally:
        locked.chmod(0o700)
    if r is None or "Operation not permitted" in r.stderr and "setpriv" in r.stderr:
        pytest.skip("cannot drop the permission to search a chmod 600 directory here")
    assert one_line(r.returncode, r.stderr) == (
        f"error: cannot write the peaks cache {locked / 'cache' / 'peaks.json'}: cannot look up its directory: "
        f"Permission denied; {FIX}")

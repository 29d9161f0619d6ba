"""A stdout or stderr closed before salactl starts (`>&-`; Python then has None for it) discards what
would go there: the command still runs and exits with its own code, never a traceback."""

import shlex
import subprocess
import sys

import pytest


def salactl_closed(args: str, closed: str) -> subprocess.CompletedProcess:
    cmd = f"{shlex.quote(sys.executable)} -m salactl {args} {closed}"
    return subprocess.run(["bash", "-c", cmd], capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("args", ["--version", "info --json", "run --prompt hi -n 2 --json"])
def test_a_closed_stdout_runs_the_command_and_prints_nothing_else(args):
    r = salactl_closed(args, ">&-")
    assert r.returncode == 0, r.stderr
    assert "Traceback" not in r.stderr


def test_a_closed_stdout_keeps_the_error_line_and_code():
    r = salactl_closed("run --prompt hi -n 2 --chunk-size 0", ">&-")
    assert r.returncode == 2 and r.stderr.startswith("error: ") and r.stderr.count("\n") == 1, r.stderr


def test_a_closed_stderr_keeps_the_exit_code():
    r = salactl_closed("run --prompt hi -n 2 --chunk-size 0", "2>&-")
    assert r.returncode == 2 and r.stdout == ""

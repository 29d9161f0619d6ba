"""A stdout or stderr closed before salactl starts (`>&-`; Python then has None for it) never gives a
traceback. A closed stderr discards what would go there. A closed stdout is no place for results:
as `echo hi >&-` fails, a command that has something for stdout runs to its end, --out files
included, and then exits 16 with one line instead of losing its results in silence."""

import json
import shlex
import subprocess
import sys

import pytest

CLOSED_STDOUT_ERROR = "error: cannot write the results to stdout: it is closed; "


def salactl_closed(args: str, closed: str, cwd=None) -> subprocess.CompletedProcess:
    cmd = f"{shlex.quote(sys.executable)} -m salactl {args} {closed}"
    return subprocess.run(["bash", "-c", cmd], capture_output=True, text=True, timeout=300, cwd=cwd)


@pytest.mark.parametrize("args", ["--version", "info --json", "run --prompt hi -n 2"])
def test_a_closed_stdout_is_exit_16_with_one_line_where_there_were_results(args, tmp_path):
    r = salactl_closed(args, ">&-", cwd=tmp_path)
    assert r.returncode == 16, r.stderr
    assert r.stderr.startswith(CLOSED_STDOUT_ERROR) and r.stderr.count("\n") == 1, r.stderr


def test_a_closed_stdout_leaves_the_out_files_whole(tmp_path):
    r = salactl_closed("run --prompt hi -n 2 --out out --json", ">&-", cwd=tmp_path)
    assert r.returncode == 16 and r.stderr.startswith(CLOSED_STDOUT_ERROR), r.stderr
    records = (tmp_path / "out" / "records.jsonl").read_text().splitlines()
    assert records and all(json.loads(line)["run_id"] for line in records)


def test_a_closed_stdout_keeps_the_error_line_and_code(tmp_path):
    r = salactl_closed("run --prompt hi -n 2 --chunk-size 0", ">&-", cwd=tmp_path)
    assert r.returncode == 2 and r.stderr.startswith("error: ") and r.stderr.count("\n") == 1, r.stderr
    assert "stdout" not in r.stderr


def test_a_closed_stderr_keeps_the_exit_code(tmp_path):
    r = salactl_closed("run --prompt hi -n 2 --chunk-size 0", "2>&-", cwd=tmp_path)
    assert r.returncode == 2 and r.stdout == ""


def test_a_closed_stderr_still_gives_the_results(tmp_path):
    r = salactl_closed("info --json", "2>&-", cwd=tmp_path)
    assert r.returncode == 0 and json.loads(r.stdout)


def test_a_later_empty_write_does_not_forget_the_dropped_results():
    import os

    from salactl.errors import OutputWriteError
    from salactl.streams import ClosedStdout

    with open(os.devnull, "w") as null:
        quiet = ClosedStdout(null)
        assert quiet.write("") == 0
        quiet.raise_if_dropped()                  # nothing was printed: nothing lost
        lost = ClosedStdout(null)
        assert lost.write("x") == 1 and lost.write("") == 0
        with pytest.raises(OutputWriteError, match="^cannot write the results to stdout: it is closed; "):
            lost.raise_if_dropped()

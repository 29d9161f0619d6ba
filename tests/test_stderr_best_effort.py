"""stderr is best-effort: a stderr that cannot be written (a full disk, a pipe nobody reads, a
descriptor open for reading, a terminal that is gone) costs neither the results nor the exit code.
Only stdout's failures change the exit: 141 when its reader leaves, 16 when it cannot be written."""

import json
import os
import pty
import subprocess
import sys
from contextlib import contextmanager

import pytest

QUANTIZE = ["quantize", "--model", "sala-nano", "--nsamples", "4", "--seqlen", "128", "--json"]
PPL = ["eval", "ppl", "--max-tokens", "64", "--seq-len", "32", "--json"]


@contextmanager
def _pipe_nobody_reads():
    """A pipe's write end whose read end is already closed: every write of it is EPIPE."""
    read, write = os.pipe()
    os.close(read)
    try:
        yield write
    finally:
        os.close(write)


@contextmanager
def _terminal_that_is_gone():
    """A terminal (isatty: rich draws live bars, refreshed from a thread) whose other side is closed:
    every write of it fails (EIO)."""
    master, slave = pty.openpty()
    os.close(master)
    try:
        yield slave
    finally:
        os.close(slave)


@contextmanager
def _open(path, flags):
    fd = os.open(path, flags)
    try:
        yield fd
    finally:
        os.close(fd)


STDERRS = {
    "full disk": lambda: _open("/dev/full", os.O_WRONLY),
    "pipe nobody reads": _pipe_nobody_reads,
    "open for reading": lambda: _open(os.devnull, os.O_RDONLY),
    "terminal that is gone": _terminal_that_is_gone,
}


def salactl(args, stderr_fd, tmp_path, stdout=subprocess.PIPE) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "salactl", *args], stdout=stdout, stderr=stderr_fd,
                          cwd=tmp_path, text=True, timeout=300)


@pytest.mark.parametrize("stderr", STDERRS)
@pytest.mark.parametrize("args, code", [(["run", "--prompt", "hi", "--chunk-size", "0"], 2),
                                        (["run", "--bogus"], 2),
                                        (["eval", "ppl", "--model", "sala-9b"], 4)])
def test_a_known_error_keeps_its_exit_code(stderr, args, code, tmp_path):
    with STDERRS[stderr]() as fd:
        r = salactl(args, fd, tmp_path)
    assert r.returncode == code and r.stdout == ""


@pytest.mark.parametrize("stderr", STDERRS)
def test_progress_on_a_failing_stderr_keeps_the_results(stderr, tmp_path):
    with STDERRS[stderr]() as fd:
        r = salactl(PPL, fd, tmp_path)
    assert r.returncode == 0 and json.loads(r.stdout)["ppl"] > 1


@pytest.mark.parametrize("stderr", ["full disk", "pipe nobody reads"])
def test_quantize_status_lines_on_a_failing_stderr_keep_the_checkpoint(stderr, tmp_path):
    with STDERRS[stderr]() as fd:
        r = salactl([*QUANTIZE, "--out", "q"], fd, tmp_path)
    assert r.returncode == 0 and json.loads(r.stdout)["modules"]
    assert (tmp_path / "q" / "model.safetensors").is_file() and (tmp_path / "q" / "config.json").is_file()


def test_stdout_that_cannot_be_written_is_still_exit_16(tmp_path):
    with _open("/dev/full", os.O_WRONLY) as full:
        r = salactl(["info", "--json"], full, tmp_path, stdout=full)
    assert r.returncode == 16


def test_the_first_failed_write_points_the_descriptor_itself_at_devnull():
    """Not only this writer's later writes are dropped: every other writer of the descriptor (rich's
    refresh thread, sys.__stderr__, C code) then writes to /dev/null and succeeds."""
    from salactl.streams import _BestEffortWrites

    with _pipe_nobody_reads() as fd:
        writes = _BestEffortWrites(fd)
        assert os.fstat(fd).st_rdev != os.stat(os.devnull).st_rdev      # a pipe to begin with
        assert writes.write(b"lost") == 4                                # dropped, no BrokenPipeError
        assert os.fstat(fd).st_rdev == os.stat(os.devnull).st_rdev
        assert os.write(fd, b"after") == 5                               # a raw write no longer fails
        assert writes.write(b"more") == 4

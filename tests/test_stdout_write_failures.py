"""stdout that cannot take what a command prints: a full disk (/dev/full) or a file-size limit
(RLIMIT_FSIZE, as `ulimit -f`; Python ignores SIGXFSZ, so the write fails with EFBIG or comes back
short) is exit 16 with one line, whether Python buffers stdout or not (PYTHONUNBUFFERED, -u: its
unbuffered stdout drops the rest of a short write, and the command would exit 0 with the output cut);
a closed pipe stays a silent exit 141."""

import os
import signal
import subprocess
import sys

import pytest

from salactl.errors import OutputWriteError

from conftest import run_cli_ok

BUFFERING = {"buffered": None, "unbuffered": "1"}
NO_SPACE = ("error: cannot write to stdout: No space left on device; free space on its disk or redirect it "
            "elsewhere")
TOO_LARGE = ("error: cannot write to stdout: File too large; the file reached a size limit of its file system "
             "or of this process (ulimit -f); redirect it elsewhere")
RUN_JSON = ("run", "--prompt", "hi", "-n", "3", "--device", "cpu", "--no-op-profile", "--json")


def salactl(args, stdout, buffering: str, preexec_fn=None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONUNBUFFERED", "SALACTL_DEBUG")}
    if BUFFERING[buffering]:
        env["PYTHONUNBUFFERED"] = BUFFERING[buffering]
    return subprocess.run([sys.executable, "-m", "salactl", *map(str, args)], stdout=stdout, stderr=subprocess.PIPE,
                          text=True, timeout=300, env=env, preexec_fn=preexec_fn)


def only_line(r: subprocess.CompletedProcess) -> str:
    assert r.returncode == OutputWriteError.exit_code == 16, r.stderr
    assert "Traceback" not in r.stderr and "Exception ignored" not in r.stderr, r.stderr
    (line,) = r.stderr.strip().splitlines()
    return line


@pytest.fixture(scope="module")
def records(tmp_path_factory):
    out = tmp_path_factory.mktemp("runs") / "r"
    run_cli_ok("run", "--prompt-ids", "1,2,3", "-n", "2", "--no-op-profile", "--device", "cpu", "--out", out)
    return out / "records.jsonl"


@pytest.mark.parametrize("buffering", BUFFERING)
@pytest.mark.parametrize("command", ["run --json", "info --json", "report latency"])
def test_a_full_disk_on_stdout_is_exit_16(records, buffering, command):
    if not os.path.exists("/dev/full"):
        pytest.skip("no /dev/full here")
    args = {"run --json": RUN_JSON, "info --json": ("info", "--json"), "report latency": ("report", "latency", records)}
    with open("/dev/full", "w") as full:
        r = salactl(args[command], full, buffering)
    assert only_line(r) == NO_SPACE


@pytest.mark.parametrize("buffering", BUFFERING)
@pytest.mark.parametrize("args", [RUN_JSON, ("info", "--json")])
def test_stdout_past_a_file_size_limit_is_exit_16_not_a_cut_output_and_exit_0(tmp_path, buffering, args):
    resource = pytest.importorskip("resource")          # POSIX only
    limit = 1024                                         # under both outputs (2 KB and more)

    def limit_file_size():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)    # as Python does: EFBIG or a short write, not a kill
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))

    with open(tmp_path / "out.json", "w") as f:
        r = salactl(args, f, buffering, limit_file_size)
    assert only_line(r) == TOO_LARGE
    assert (tmp_path / "out.json").stat().st_size == limit


@pytest.mark.parametrize("buffering", BUFFERING)
def test_a_closed_pipe_stays_a_silent_exit_141(buffering):
    read_end, write_end = os.pipe()
    os.close(read_end)                                  # the reader is gone before the first write
    r = salactl(("info", "--json"), write_end, buffering)
    os.close(write_end)
    assert r.returncode == 141 and r.stderr == ""

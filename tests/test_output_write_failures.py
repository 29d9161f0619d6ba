"""A disk that fills up while salactl writes (simulated with RLIMIT_FSIZE, as `ulimit -f` does: a
write past the limit fails with EFBIG) and an existing output file that cannot be written: one
line naming the output, exit 16 (or 2 before any work), and no partial output left behind."""

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from salactl.errors import OutputWriteError, UsageError

from conftest import run_cli

RUN = ("run", "--prompt-ids", "1,2,3", "-n", "2", "--no-op-profile", "--device", "cpu")


def salactl_with_file_limit(limit_bytes: int, *args) -> subprocess.CompletedProcess:
    """`salactl ARGS` in a child whose writes past `limit_bytes` of a file fail with EFBIG."""
    resource = pytest.importorskip("resource")          # POSIX only

    def limit_file_size():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)        # EFBIG from write(), not a killed process
        _, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit_bytes, hard))

    return subprocess.run([sys.executable, "-m", "salactl", *map(str, args)], capture_output=True, text=True,
                          timeout=300, env=dict(os.environ), preexec_fn=limit_file_size)


def error_line(stderr: str) -> str:
    """The last stderr line, after checking there is no traceback (torch.profiler may log a line of
    its own before it)."""
    assert "Traceback" not in stderr, stderr
    return stderr.strip().splitlines()[-1]


def test_a_full_disk_during_a_records_append_leaves_the_records_file_as_it_was(tmp_path):
    records = tmp_path / "D" / "records.jsonl"
    records.parent.mkdir()
    records.write_text('{"phase": "prefill", "kind": "run"}\n')
    before = records.read_bytes()
    r = salactl_with_file_limit(len(before) + 200, *RUN, "--out", records.parent)     # a record is ~1 KB
    assert r.returncode == OutputWriteError.exit_code == 16, r.stderr
    assert error_line(r.stderr) == (f"error: cannot append to {records}: File too large; the file reached a size "
                                    "limit of its file system or of this process (ulimit -f); choose another --out")
    assert records.read_bytes() == before                  # no torn line for `report latency` to refuse


def test_a_full_disk_while_quantizing_is_one_line_and_leaves_no_checkpoint(tmp_path):
    out = tmp_path / "q"
    r = salactl_with_file_limit(1 << 20, "quantize", "--model", "sala-nano", "--method", "rtn", "--out", out)
    assert r.returncode == OutputWriteError.exit_code, r.stderr
    line = error_line(r.stderr)
    assert line.startswith(f"error: cannot write the checkpoint {out}: ") and "File too large" in line
    assert line.endswith("a size limit of its file system or of this process (ulimit -f); choose another --out")
    assert os.listdir(tmp_path) == []                       # neither the checkpoint nor its temp dir


def test_a_full_disk_while_exporting_the_torch_trace_names_the_profile_dir(tmp_path):
    """torch.profiler logs a failed trace write and returns as if it had written it."""
    out = tmp_path / "p"
    r = salactl_with_file_limit(8 << 10, "profile", "--torch", "--phase", "decode", "--context", 16, "--warmup", 0,
                                "--out", out)
    assert r.returncode == OutputWriteError.exit_code, r.stderr
    assert error_line(r.stderr) == (f"error: cannot write the profile in {out}: torch.profiler could not write "
                                    "its Chrome trace (disk full?); free space on its disk or choose another --out")
    assert os.listdir(tmp_path) == []                       # no profile and no staging directory


def unwritable_file(path: Path) -> None:
    """An existing file at `path` that no one can open for writing, root included (as a file on a
    read-only bind mount): a link to a read-only sysctl."""
    target = Path("/proc/sys/kernel/version")
    if not target.exists():
        pytest.skip("no /proc/sys")
    path.symlink_to(target)


@pytest.mark.parametrize("command", [RUN, ("bench", "--profile", "soar", "--scale", "0.002"),
                                     ("sweep", "--device", "cpu")])
def test_an_existing_records_file_that_cannot_be_written_is_refused_before_the_work(tmp_path, capsys, command):
    out = tmp_path / "D"
    out.mkdir()
    unwritable_file(out / "records.jsonl")
    code, stdout, err = run_cli([*command, "--out", out], capsys)
    assert code == UsageError.exit_code, err
    assert err.strip().splitlines() == [f"error: --out {out}: cannot write {out / 'records.jsonl'} (Permission "
                                        "denied); make it writable or choose another --out"]
    assert stdout == ""

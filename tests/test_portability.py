"""What differs off Linux, checked on Linux: output to a file or pipe in a legacy encoding (Windows'
cp1252), no SIGPIPE (Windows), two paths naming one directory (a case-insensitive file system), and
host memory without /proc/meminfo (macOS, Windows)."""

import contextlib
import json
import os
import pty
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from salactl.runtime.loader import available_host_bytes
from test_quantize_cli import small_config, write_random_checkpoint

CP1252 = {**os.environ, "PYTHONIOENCODING": "cp1252"}


def salactl(*args, env=None):
    return subprocess.run([sys.executable, "-m", "salactl", *map(str, args)], capture_output=True, timeout=300,
                          env=env or os.environ)


def not_cp1252(text: str) -> set[str]:
    return {c for c in text if c.encode("cp1252", errors="replace") == b"?" and c != "?"}


def test_generated_text_piped_in_a_legacy_encoding_arrives_whole_in_utf8():
    """At temperature 20 the samples are nearly uniform over the vocabulary, whose single bytes
    decode to U+FFFD and control characters: 200 of them hold characters cp1252 has no byte for."""
    args = ["run", "-p", "x", "-n", 200, "--temperature", 20, "--seed", 1, "--device", "cpu"]
    text = json.loads(salactl(*args, "--json").stdout)["text"]
    assert not_cp1252(text), "the sample holds no character outside cp1252; pick another --seed"
    piped = salactl(*args, env=CP1252)
    assert piped.returncode == 0, piped.stderr.decode()
    assert piped.stdout.decode("utf-8").startswith(text)


def test_a_tables_fixed_labels_piped_in_a_legacy_encoding(tmp_path):
    piped = salactl("bench", "--profile", "soar", "--scale", "0.002", "--num-requests", 2, "--device", "cpu",
                    "--out", tmp_path / "b", env=CP1252)
    assert piped.returncode == 0, piped.stderr.decode()
    assert "∞" in piped.stdout.decode("utf-8")


def test_a_terminal_in_a_legacy_encoding_shows_what_it_cannot_as_a_question_mark(tmp_path):
    master, slave = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "salactl", "bench", "--profile", "soar", "--scale", "0.002",
                             "--num-requests", "2", "--device", "cpu", "--out", tmp_path / "b"],
                            stdin=subprocess.DEVNULL, stdout=slave, stderr=subprocess.PIPE,
                            env={**CP1252, "COLUMNS": "200", "NO_COLOR": "1", "TERM": "xterm"})
    os.close(slave)
    shown = b""
    with contextlib.suppress(OSError):          # EIO: the child closed the terminal
        while data := os.read(master, 65536):
            shown += data
    os.close(master)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err.decode()
    assert re.search(r"Smax\s*\|\s*\?", shown.decode("cp1252"))        # its concurrency, ∞


def test_a_closed_pipe_exits_141_where_signal_has_no_sigpipe():
    no_sigpipe = ("import signal, sys\n"
                  "del signal.SIGPIPE\n"
                  "sys.argv = ['salactl', 'report', 'memory']\n"
                  "from salactl.cli import main\n"
                  "main()\n")
    read_end, write_end = os.pipe()
    proc = subprocess.Popen([sys.executable, "-c", no_sigpipe], stdout=write_end, stderr=subprocess.PIPE)
    os.close(write_end)
    os.close(read_end)                  # the reader is gone before the first write
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 141 and err == b""


def _can_bind_mount(tmp_path: Path) -> bool:
    if shutil.which("unshare") is None or shutil.which("mount") is None:
        return False
    (tmp_path / "a").mkdir(), (tmp_path / "b").mkdir()
    probe = subprocess.run(["unshare", "--map-root-user", "--mount", "mount", "--bind", tmp_path / "a",
                            tmp_path / "b"], capture_output=True)
    return probe.returncode == 0


@pytest.mark.parametrize("where", ["same", "inside", "holding"])
def test_out_is_refused_where_another_path_names_the_source_checkpoint(where, tmp_path):
    """A bind mount gives the checkpoint a second path, as a case-insensitive file system (macOS's
    default) does for `mymodel` and `MyModel`: the two never compare equal as strings."""
    if not _can_bind_mount(tmp_path):
        pytest.skip("needs unshare and mount --bind in a new mount namespace")
    real, alias = tmp_path / "real", tmp_path / "alias"
    src = write_random_checkpoint(real / "src", small_config())
    (real / "config.json").write_text("{}")             # so --overwrite would take `real` for a checkpoint
    alias.mkdir()
    out = {"same": src, "inside": src / "q", "holding": real}[where]
    before = {p: p.read_bytes() for p in src.iterdir()}
    quantize = [sys.executable, "-m", "salactl", "quantize", "--model", alias / "src", "--out", out, "--overwrite",
                "--method", "rtn", "--device", "cpu"]
    proc = subprocess.run(["unshare", "--map-root-user", "--mount", "sh", "-c",
                           'mount --bind "$1" "$2" && shift 2 && exec "$@"', "sh", real, alias, *quantize], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 10 and proc.stderr.count("\n") == 1, proc.stderr
    assert {"same": "is", "inside": "is inside", "holding": "holds"}[where] + " the source checkpoint" in proc.stderr
    assert {p: p.read_bytes() for p in src.iterdir()} == before


@pytest.mark.skipif(not hasattr(os, "sysconf"), reason="the fallback read here is sysconf's")
def test_host_memory_without_meminfo_is_the_physical_memory(tmp_path):
    total = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    no_limits = tmp_path / "none"                   # no cgroup or VmSize to read either
    assert available_host_bytes(tmp_path / "no-meminfo", no_limits, no_limits) == total > 0

"""write_atomic and atomic_path: one output file all-or-nothing, with no temp file left behind;
write_all and move_all without overwrite never replace a file another process wrote meanwhile; a
full disk is one OutputWriteError naming the output; exclusive_lock."""

import errno
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from salactl.errors import OutputExistsError, OutputWriteError
from salactl.reports.atomic import atomic_path, exclusive_lock, move_all, write_all, write_atomic


def test_write_atomic_writes_str_as_utf8_and_bytes_as_is(tmp_path):
    write_atomic(tmp_path / "a.txt", "héllo\n")
    write_atomic(tmp_path / "b.bin", b"\x00\xffraw")
    assert (tmp_path / "a.txt").read_bytes() == "héllo\n".encode("utf-8")
    assert (tmp_path / "b.bin").read_bytes() == b"\x00\xffraw"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.txt", "b.bin"]


def test_write_atomic_replaces_an_existing_file_and_makes_missing_parents(tmp_path):
    (tmp_path / "r.json").write_text("old")
    write_atomic(tmp_path / "r.json", "new")
    write_atomic(tmp_path / "sub" / "dir" / "s.json", "made")
    assert (tmp_path / "r.json").read_text() == "new"
    assert (tmp_path / "sub" / "dir" / "s.json").read_text() == "made"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.json", "sub"]


def test_a_write_that_raises_leaves_the_old_file_and_no_temp(tmp_path):
    (tmp_path / "r.json").write_text("old")
    with pytest.raises(TypeError):
        write_atomic(tmp_path / "r.json", 42)        # neither str nor bytes: write_text raises
    assert (tmp_path / "r.json").read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["r.json"]


def test_a_rename_that_fails_leaves_the_old_file_and_no_temp(tmp_path, monkeypatch):
    (tmp_path / "r.json").write_text("old")

    def replace(src, dst):
        raise OSError(28, "No space left on device", str(dst))

    monkeypatch.setattr(os, "replace", replace)
    with pytest.raises(OutputWriteError, match=f"^cannot write {tmp_path / 'r.json'}: No space left on device; "):
        write_atomic(tmp_path / "r.json", "new")
    monkeypatch.undo()
    assert (tmp_path / "r.json").read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["r.json"]


def test_atomic_path_keeps_the_suffix_and_renames_when_the_block_ends(tmp_path):
    with atomic_path(tmp_path / "plot.png") as tmp:
        assert tmp.parent == tmp_path and tmp.suffix == ".png" and tmp.name != "plot.png"
        tmp.write_bytes(b"png")
        assert not (tmp_path / "plot.png").exists()
    assert (tmp_path / "plot.png").read_bytes() == b"png"
    assert [p.name for p in tmp_path.iterdir()] == ["plot.png"]


def test_atomic_path_removes_its_temp_when_the_block_raises(tmp_path):
    (tmp_path / "trace.json").write_text("old")
    with pytest.raises(RuntimeError, match="export failed"):
        with atomic_path(tmp_path / "trace.json") as tmp:
            tmp.write_text("half a trace")
            raise RuntimeError("export failed")
    assert (tmp_path / "trace.json").read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["trace.json"]


def test_exclusive_lock_refuses_a_second_holder_without_waiting_and_removes_its_file(tmp_path):
    lock = tmp_path / "out.lock"
    with exclusive_lock(lock, remove=True):
        with pytest.raises(BlockingIOError):
            with exclusive_lock(lock, wait=False):
                pass
    assert not lock.exists()


def landing_theirs_while_writing(monkeypatch, write_name: str, theirs: Path) -> None:
    """Another process writes `theirs` while ours writes its temp for `write_name` (after our check
    that the destinations are free, before ours are placed)."""
    real_write_text = Path.write_text

    def write_text(self, data, *args, **kwargs):
        if self.name.startswith(f".{write_name}.") and not theirs.exists():
            real_write_text(theirs, "theirs")
        return real_write_text(self, data, *args, **kwargs)

    monkeypatch.setattr(Path, "write_text", write_text)


def test_write_all_without_overwrite_never_replaces_a_file_written_since_its_check(tmp_path, monkeypatch):
    """Two `report latency --out R` at once: the second to finish is refused, and the first's
    files stay whole."""
    landing_theirs_while_writing(monkeypatch, "b.md", tmp_path / "b.md")
    with pytest.raises(OutputExistsError, match=f"^{tmp_path / 'b.md'} already exists; choose another --out "
                                                "or pass --overwrite$"):
        write_all({tmp_path / "a.md": "ours", tmp_path / "b.md": "ours"}, overwrite=False)
    assert {p.name: p.read_text() for p in tmp_path.iterdir()} == {"b.md": "theirs"}    # a.md taken back


def test_move_all_without_overwrite_never_replaces_a_file_written_since_its_check(tmp_path, monkeypatch):
    staging, out = tmp_path / "staging", tmp_path / "out"
    staging.mkdir()
    (staging / "result.json").write_text("ours")
    real_mkdir = Path.mkdir

    def mkdir_as_theirs_lands(self, *args, **kwargs):
        real_mkdir(self, *args, **kwargs)
        if self == out:
            (out / "result.json").write_text("theirs")

    monkeypatch.setattr(Path, "mkdir", mkdir_as_theirs_lands)
    with pytest.raises(OutputExistsError, match="result.json already exists"):
        move_all(staging, out, overwrite=False)
    assert (out / "result.json").read_text() == "theirs"
    assert (staging / "result.json").read_text() == "ours"


def test_without_hard_links_write_all_still_writes_and_refuses_an_existing_file(tmp_path, monkeypatch):
    def link(src, dst, *args, **kwargs):
        raise PermissionError(errno.EPERM, "Operation not permitted")     # as FAT or some FUSE mounts

    monkeypatch.setattr(os, "link", link)
    write_all({tmp_path / "a.md": "a", tmp_path / "b.md": "b"}, overwrite=False)
    with pytest.raises(OutputExistsError):
        write_all({tmp_path / "a.md": "new"}, overwrite=False)
    assert {p.name: p.read_text() for p in tmp_path.iterdir()} == {"a.md": "a", "b.md": "b"}


def python_with_file_limit(limit_bytes: int, code: str) -> subprocess.CompletedProcess:
    """`python -c CODE` in a child whose writes past `limit_bytes` of a file fail with EFBIG (as on a
    full disk) instead of killing it."""
    resource = pytest.importorskip("resource")          # POSIX only

    def limit_file_size():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        _, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit_bytes, hard))

    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                          preexec_fn=limit_file_size)


@pytest.mark.parametrize("writer", ["write_atomic(path, 'x' * 8192)", "write_all({path: 'x' * 8192})",
                                    "write_all({path: 'x' * 8192}, overwrite=False)"])
def test_a_full_disk_is_an_output_write_error_naming_the_file_with_no_temp_left(tmp_path, writer):
    path = tmp_path / "summary.json"
    code = f"""
from pathlib import Path
from salactl.reports.atomic import write_all, write_atomic
from salactl.errors import OutputWriteError
path = Path({str(path)!r})
try:
    {writer}
except OutputWriteError as e:
    print(type(e).__name__, e.exit_code, e)
"""
    r = python_with_file_limit(4096, code)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == (f"DiskFullError 16 cannot write {path}: File too large; the file reached a size "
                                "limit of its file system or of this process (ulimit -f); choose another --out")
    assert os.listdir(tmp_path) == []

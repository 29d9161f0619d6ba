"""write_atomic and atomic_path: one output file all-or-nothing, with no temp file left behind."""

import os

import pytest

from salactl.reports.atomic import atomic_path, write_atomic


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
    with pytest.raises(OSError, match="No space"):
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

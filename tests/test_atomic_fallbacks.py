"""Writes where the file system refuses a hard link for any reason (ENOSYS on sshfs and other FUSE
mounts, EMLINK, EXDEV) still place their files by checking and renaming; a write that fails leaves
no directory it made; a checkpoint that cannot be written says why and names the file, and only a
full disk is called one."""

import errno
import json
import os

import pytest
import torch

from salactl.errors import CheckpointError, OutputExistsError, OutputWriteError
from salactl.reports.atomic import move_all, write_all
from salactl.runtime.checkpoint import random_state_dict
from salactl.runtime.checkpoint_write import save_checkpoint

from conftest import run_cli, tiny_config
from test_atomic_writes import python_with_file_limit
from test_report_latency_records import rec

LINK_REFUSALS = [errno.ENOSYS, errno.EMLINK, errno.EXDEV]


def refuse_links(monkeypatch, code: int) -> None:
    def link(src, dst, *args, **kwargs):
        raise OSError(code, os.strerror(code), str(src), None, str(dst))

    monkeypatch.setattr(os, "link", link)


@pytest.mark.parametrize("code", LINK_REFUSALS, ids=errno.errorcode.get)
def test_report_latency_out_writes_where_links_are_refused(tmp_path, monkeypatch, capsys, code):
    records = tmp_path / "records.jsonl"
    records.write_text(json.dumps(rec("a", "S1", mean_ttft_ms=10.0)) + "\n")
    out = tmp_path / "R"
    refuse_links(monkeypatch, code)
    exit_code, _, err = run_cli(["report", "latency", records, "--out", out, "--format", "md,csv"], capsys)
    assert exit_code == 0, err
    assert sorted(os.listdir(out)) == ["report.csv", "report.md"]
    exit_code, _, err = run_cli(["report", "latency", records, "--out", out, "--format", "md"], capsys)
    assert exit_code == OutputExistsError.exit_code, err     # still never replaced without --overwrite


@pytest.mark.parametrize("code", LINK_REFUSALS, ids=errno.errorcode.get)
def test_write_all_without_links_refuses_a_file_written_since_its_check(tmp_path, monkeypatch, code):
    refuse_links(monkeypatch, code)
    write_all({tmp_path / "a.md": "a"}, overwrite=False)
    with pytest.raises(OutputExistsError):
        write_all({tmp_path / "a.md": "new", tmp_path / "b.md": "b"}, overwrite=False)
    assert {p.name: p.read_text() for p in tmp_path.iterdir()} == {"a.md": "a"}


def test_a_full_disk_leaves_no_directory_the_write_made(tmp_path):
    path = tmp_path / "R" / "sub" / "summary.json"
    code = f"""
from pathlib import Path
from salactl.reports.atomic import write_all
from salactl.errors import OutputWriteError
try:
    write_all({{Path({str(path)!r}): 'x' * 8192}}, overwrite=False)
except OutputWriteError as e:
    print(e.exit_code, e)
"""
    r = python_with_file_limit(4096, code)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith(f"16 cannot write {path}: File too large")
    assert os.listdir(tmp_path) == []


def test_a_move_that_fails_leaves_no_directory_the_move_made(tmp_path, monkeypatch):
    staging, out = tmp_path / "staging", tmp_path / "out" / "sub"
    staging.mkdir()
    (staging / "result.json").write_text("ours")
    refuse_links(monkeypatch, errno.EXDEV)

    def replace(src, dst):
        raise PermissionError(errno.EACCES, "Permission denied", str(src), None, str(dst))

    monkeypatch.setattr(os, "replace", replace)
    with pytest.raises(PermissionError):
        move_all(staging, out, overwrite=False)
    monkeypatch.undo()
    assert sorted(os.listdir(tmp_path)) == ["staging"]
    assert (staging / "result.json").read_text() == "ours"


def tiny_state(cfg):
    return random_state_dict(cfg, "cpu", torch.float32, 0)


@pytest.mark.parametrize("source", ["a directory", "removed meanwhile"])
def test_a_file_to_copy_that_cannot_be_read_is_named_and_not_called_a_full_disk(tmp_path, source):
    cfg = tiny_config()
    src = tmp_path / "model" / "LICENSE"
    src.mkdir(parents=True) if source == "a directory" else src.parent.mkdir()
    out = tmp_path / "ckpt"
    with pytest.raises(CheckpointError) as e:
        save_checkpoint(tiny_state(cfg), cfg.to_hf_dict(), out, extra_files={"LICENSE": src})
    cause = os.strerror(errno.EISDIR if source == "a directory" else errno.ENOENT)
    assert str(e.value) == f"cannot read {src}, to copy into the checkpoint: {cause}; make it a readable file"
    assert sorted(os.listdir(tmp_path)) == ["model"]


def test_a_checkpoint_file_that_cannot_be_written_is_named_and_not_called_a_full_disk(tmp_path):
    cfg = tiny_config()
    src = tmp_path / "LICENSE"
    src.write_text("license")
    name = "L" * 300                                        # past the file system's name limit
    out = tmp_path / "ckpt"
    with pytest.raises(OutputWriteError) as e:
        save_checkpoint(tiny_state(cfg), cfg.to_hf_dict(), out, extra_files={name: src})
    assert str(e.value) == f"cannot write {out / name}: {os.strerror(errno.ENAMETOOLONG)}; choose another --out"
    assert sorted(os.listdir(tmp_path)) == ["LICENSE"]

"""save_checkpoint(overwrite=True) replaces a checkpoint so that, stopped at any point, the output
directory holds a whole checkpoint, the old or the new, and what an interrupted run leaves behind
does not get in the next run's way."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from salactl.runtime.checkpoint import random_state_dict

from salactl.runtime.checkpoint_write import save_checkpoint
from salactl.runtime.loader import load_model
from conftest import tiny_config

TESTS = Path(__file__).resolve().parent


def _save(out: Path, version: str, overwrite: bool = False) -> Path:
    cfg = tiny_config()
    state = random_state_dict(cfg, "cpu", torch.float32, 0)
    return save_checkpoint(state, cfg.to_hf_dict() | {"version": version}, out, overwrite=overwrite)


def _version(out: Path) -> str:
    """Which checkpoint `out` holds, after checking it loads whole."""
    load_model(str(out), "cpu", "float32")
    return json.loads((out / "config.json").read_text())["version"]


def test_interrupt_while_deleting_the_old_checkpoint_leaves_the_new_one(tmp_path, monkeypatch):
    out = _save(tmp_path / "ckpt", "old")
    real_rmtree = shutil.rmtree

    def rmtree_interrupted_midway(path, *args, **kwargs):
        path = Path(path)
        if path.name.startswith(".ckpt.old-") and (path / "config.json").exists():
            (path / "config.json").unlink()
            raise KeyboardInterrupt
        real_rmtree(path, *args, **kwargs)

    monkeypatch.setattr(shutil, "rmtree", rmtree_interrupted_midway)
    with pytest.raises(KeyboardInterrupt):
        _save(out, "new", overwrite=True)
    monkeypatch.undo()
    assert _version(out) == "new"

    _save(out, "newer", overwrite=True)          # the half-deleted backup is no obstacle, and goes
    assert _version(out) == "newer"
    assert [p.name for p in tmp_path.iterdir()] == ["ckpt"]


def test_interrupt_between_the_renames_puts_the_old_checkpoint_back(tmp_path, monkeypatch):
    out = _save(tmp_path / "ckpt", "old")
    real_replace = os.replace

    def replace_interrupted_before_the_new_one(src, dst):
        if Path(src).name.startswith(".ckpt.tmp-"):
            raise KeyboardInterrupt
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", replace_interrupted_before_the_new_one)
    with pytest.raises(KeyboardInterrupt):
        _save(out, "new", overwrite=True)
    monkeypatch.undo()
    assert _version(out) == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["ckpt"]


def test_a_backup_left_by_an_earlier_run_is_removed(tmp_path):
    out = _save(tmp_path / "ckpt", "old")
    shutil.copytree(out, tmp_path / ".ckpt.old-k3x9q2_a")          # mkdtemp's 8-character suffix
    (tmp_path / ".ckpt.old-2024-keep").mkdir()                      # a user's own folder stays
    _save(out, "new", overwrite=True)
    assert _version(out) == "new"
    assert sorted(p.name for p in tmp_path.iterdir()) == [".ckpt.old-2024-keep", "ckpt"]


def test_a_running_processs_backup_stays_and_a_dead_ones_goes(tmp_path):
    """A concurrent --overwrite holds its old checkpoint in a backup named by its pid until its own
    swap ends; deleting it would leave that run nothing to put back."""
    out = _save(tmp_path / "ckpt", "old")
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True, check=True).stdout.strip()
    live = f".ckpt.old-{os.getppid()}-k3x9q2_a"                     # our parent: running
    shutil.copytree(out, tmp_path / live)
    shutil.copytree(out, tmp_path / f".ckpt.old-{dead}-z8y7x6w5")
    _save(out, "new", overwrite=True)
    assert _version(out) == "new"
    assert sorted(p.name for p in tmp_path.iterdir()) == [live, "ckpt"]


def test_sigint_while_a_large_checkpoint_dir_is_deleted(tmp_path):
    """The reviewer's repro in one process: the old directory holds many files, so deleting it takes
    a while, and a real Ctrl-C arrives while it does (20 ms after the first rmtree starts)."""
    out = _save(tmp_path / "ckpt", "old")
    for i in range(20000):
        (out / f"junk{i:05d}").touch()
    code = ("import os, shutil, signal, sys, threading, time\n"
            "from pathlib import Path\n"
            f"sys.path.insert(0, {str(TESTS)!r})\n"
            "from test_hygiene_checkpoint_swap import _save\n"
            "real_rmtree = shutil.rmtree\n"
            "def rmtree_then_sigint(path, *args, **kwargs):\n"
            "    shutil.rmtree = real_rmtree\n"
            "    threading.Timer(0.02, os.kill, (os.getpid(), signal.SIGINT)).start()\n"
            "    real_rmtree(path, *args, **kwargs)\n"
            "shutil.rmtree = rmtree_then_sigint\n"
            f"_save(Path({str(out)!r}), 'new', overwrite=True)\n"
            "time.sleep(5)\n")                    # the interrupt, had the deletion ended first
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert "KeyboardInterrupt" in p.stderr
    junk_left = len(list(out.glob("junk*")))
    assert (_version(out), junk_left) in {("old", 20000), ("new", 0)}     # one or the other, whole
    _save(out, "newer", overwrite=True)
    assert [p.name for p in tmp_path.iterdir()] == ["ckpt"]
    assert _version(out) == "newer" and not list(out.glob("junk*"))

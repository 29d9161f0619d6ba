"""An exception (Ctrl-C) raised at every step boundary of save_checkpoint(overwrite=True)'s swap,
before or after each rename and each deletion, leaves the output directory a whole checkpoint, the
old one or the new, and nothing beside it. Python runs a signal's handler right after the rename
that it arrived during returns, so "after" is where a real Ctrl-C lands."""

import os
import shutil
import signal
from pathlib import Path

import pytest

from test_hygiene_checkpoint_swap import _save, _version


def _record_swap_calls(tmp_path: Path, monkeypatch) -> list[tuple[str, str]]:
    """(function, first argument's name) of each os.replace / shutil.rmtree call an overwrite makes."""
    out = _save(tmp_path / "ckpt", "old")
    calls = []
    for module, fn in ((os, "replace"), (shutil, "rmtree")):
        real = getattr(module, fn)

        def recording(path, *args, _real=real, _fn=fn, **kwargs):
            calls.append((_fn, Path(path).name))
            return _real(path, *args, **kwargs)

        monkeypatch.setattr(module, fn, recording)
    _save(out, "new", overwrite=True)
    monkeypatch.undo()
    return calls


def test_the_overwrite_makes_the_calls_the_boundaries_below_cover(tmp_path, monkeypatch):
    calls = _record_swap_calls(tmp_path, monkeypatch)
    assert [(fn, name.split("-")[0]) for fn, name in calls] == [
        ("replace", "ckpt"), ("replace", ".ckpt.tmp"), ("rmtree", ".ckpt.old")]


# (call index, raise before or after the real call, the checkpoint left): calls as recorded above
BOUNDARIES = [(0, "before", "old"), (0, "after", "old"), (1, "before", "old"), (1, "after", "new"),
              (2, "before", "new"), (2, "after", "new")]


@pytest.mark.parametrize("index, when, left", BOUNDARIES)
def test_an_interrupt_at_each_boundary_leaves_one_whole_checkpoint(tmp_path, monkeypatch, index, when, left):
    out = _save(tmp_path / "ckpt", "old")
    count = [0]
    for module, fn in ((os, "replace"), (shutil, "rmtree")):
        real = getattr(module, fn)

        def interrupted(path, *args, _real=real, **kwargs):
            count[0] += 1
            hit = count[0] - 1 == index
            if hit and when == "before":
                raise KeyboardInterrupt
            _real(path, *args, **kwargs)
            if hit:
                raise KeyboardInterrupt

        monkeypatch.setattr(module, fn, interrupted)
    with pytest.raises(KeyboardInterrupt):
        _save(out, "new", overwrite=True)
    monkeypatch.undo()
    assert _version(out) == left
    assert [p.name for p in tmp_path.iterdir()] == ["ckpt"]


def test_a_real_sigint_during_the_first_rename_puts_the_old_checkpoint_back(tmp_path, monkeypatch):
    """The reviewer's repro: the handler runs once the rename of the old checkpoint aside returns."""
    out = _save(tmp_path / "ckpt", "old")
    real_replace = os.replace

    def replace_then_sigint(src, dst):
        real_replace(src, dst)
        if Path(src) == out:
            signal.raise_signal(signal.SIGINT)

    monkeypatch.setattr(os, "replace", replace_then_sigint)
    old_handler = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(KeyboardInterrupt):
            _save(out, "new", overwrite=True)
    finally:
        signal.signal(signal.SIGINT, old_handler)
    monkeypatch.undo()
    assert _version(out) == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["ckpt"]


def test_the_old_checkpoint_is_kept_when_something_else_took_its_place(tmp_path, monkeypatch):
    """Another process puts files (no checkpoint) at the output between the two renames: the rename
    of the new checkpoint is refused, and the backup, the only whole checkpoint left, stays."""
    from salactl.errors import OutputExistsError

    out = _save(tmp_path / "ckpt", "old")
    real_replace = os.replace

    def replace_then_taken(src, dst):
        real_replace(src, dst)
        if Path(src) == out:
            out.mkdir()
            (out / "notes.txt").write_text("not a checkpoint")

    monkeypatch.setattr(os, "replace", replace_then_taken)
    with pytest.raises(OutputExistsError):
        _save(out, "new", overwrite=True)
    monkeypatch.undo()
    [backup] = [p for p in tmp_path.iterdir() if p.name.startswith(".ckpt.old-")]
    assert _version(backup) == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == [backup.name, "ckpt"]

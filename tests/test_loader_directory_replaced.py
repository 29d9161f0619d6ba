"""load_model of a checkpoint directory that `quantize --overwrite` replaces while it is read: it
must not mix the old config.json with the new weights (and blame a valid checkpoint); it loads
again from the new directory, and says what happened when the directory keeps changing."""

import os
import shutil
from pathlib import Path

import pytest
from safetensors import safe_open

import salactl.runtime.checkpoint as checkpoint_module
from salactl.errors import CheckpointError
from salactl.quant.api import quantize_checkpoint
from salactl.quant.sequential import QuantOptions
from salactl.runtime.loader import load_model


@pytest.fixture(scope="module")
def rtn_checkpoints(tmp_path_factory) -> dict[int, Path]:
    """sala-nano quantized with RTN to 4 and to 8 bits: same config, differently shaped qweights."""
    root = tmp_path_factory.mktemp("rtn")
    return {bits: Path(quantize_checkpoint("sala-nano", root / f"w{bits}", QuantOptions(bits=bits, method="rtn"),
                                           device="cpu", dtype="float32")["out"])
            for bits in (4, 8)}


def _swap_in(target: Path, source: Path, aside: Path) -> None:
    """What save_checkpoint(overwrite=True) does: the old directory aside, a new one renamed in."""
    fresh = target.parent / f".fresh-{aside.name}"
    shutil.copytree(source, fresh)
    os.replace(target, aside)
    os.replace(fresh, target)


def _bits(lm) -> int:
    return dict(lm.config.extra)["quantization_config"]["bits"]


def test_a_directory_replaced_after_its_config_was_read_is_loaded_again(tmp_path, rtn_checkpoints, monkeypatch):
    ckpt = tmp_path / "ckpt"
    shutil.copytree(rtn_checkpoints[4], ckpt)
    swaps = []

    def safe_open_after_a_swap(*args, **kwargs):
        if not swaps:                   # config.json (4-bit) is read; the 8-bit checkpoint takes its place
            swaps.append(tmp_path / "old")
            _swap_in(ckpt, rtn_checkpoints[8], swaps[-1])
        return safe_open(*args, **kwargs)

    monkeypatch.setattr(checkpoint_module, "safe_open", safe_open_after_a_swap)
    lm = load_model(ckpt, "cpu", "float32")
    assert len(swaps) == 1 and _bits(lm) == 8
    assert lm.model_dir == ckpt


def test_a_directory_replaced_during_every_load_is_a_checkpoint_error(tmp_path, rtn_checkpoints, monkeypatch):
    ckpt = tmp_path / "ckpt"
    shutil.copytree(rtn_checkpoints[4], ckpt)
    swaps = []

    def safe_open_after_a_swap(*args, **kwargs):
        swaps.append(tmp_path / f"old{len(swaps)}")
        _swap_in(ckpt, rtn_checkpoints[8 if len(swaps) % 2 else 4], swaps[-1])
        return safe_open(*args, **kwargs)

    monkeypatch.setattr(checkpoint_module, "safe_open", safe_open_after_a_swap)
    with pytest.raises(CheckpointError, match=r"ckpt was replaced while it was being read \(another salactl "
                                              r"quantize --overwrite\?\); run again"):
        load_model(ckpt, "cpu", "float32")


def test_a_directory_renamed_in_while_the_load_looked_for_it_is_loaded(tmp_path, rtn_checkpoints, monkeypatch):
    """Between a swap's two renames the directory is missing for a moment: a load that looks for it
    then tries again once it is back."""
    ckpt = tmp_path / "ckpt"
    real_stat = os.stat

    def stat_then_rename_in(path, *args, **kwargs):
        try:
            return real_stat(path, *args, **kwargs)
        except FileNotFoundError:
            if Path(path) == ckpt:      # the load found nothing: the swap's second rename lands now
                shutil.copytree(rtn_checkpoints[8], tmp_path / "fresh")
                os.replace(tmp_path / "fresh", ckpt)
            raise

    monkeypatch.setattr(os, "stat", stat_then_rename_in)
    lm = load_model(ckpt, "cpu", "float32")
    assert _bits(lm) == 8
    with pytest.raises(CheckpointError, match="neither a checkpoint directory"):    # missing before and after
        load_model(tmp_path / "never", "cpu", "float32")


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="counts open files through /proc")
def test_the_directory_is_not_left_open(rtn_checkpoints):
    before = len(os.listdir("/proc/self/fd"))
    lm = load_model(rtn_checkpoints[4], "cpu", "float32")
    assert _bits(lm) == 4 and len(os.listdir("/proc/self/fd")) == before


def test_a_replacement_of_the_same_shapes_loads_with_its_own_config(tmp_path, rtn_checkpoints, monkeypatch):
    """A swap that breaks nothing (same shapes, another rope_theta) must not leave the old config.json
    driving the new weights: the load that saw the swap runs again."""
    import json

    ckpt, other = tmp_path / "ckpt", tmp_path / "other"
    shutil.copytree(rtn_checkpoints[4], ckpt)
    shutil.copytree(rtn_checkpoints[4], other)
    config = json.loads((other / "config.json").read_text())
    config["rope_theta"] = 123456.0
    (other / "config.json").write_text(json.dumps(config))
    swaps = []

    def safe_open_after_a_swap(*args, **kwargs):
        if not swaps:
            swaps.append(tmp_path / "old")
            _swap_in(ckpt, other, swaps[-1])
        return safe_open(*args, **kwargs)

    monkeypatch.setattr(checkpoint_module, "safe_open", safe_open_after_a_swap)
    assert load_model(ckpt, "cpu", "float32").config.rope_theta == 123456.0 and len(swaps) == 1


def test_a_directory_set_aside_counts_as_replaced(tmp_path):
    from salactl.runtime.loader import _DirectoryPin

    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    with _DirectoryPin(ckpt) as pin:
        assert not pin.replaced()
        os.rename(ckpt, tmp_path / "aside")         # between a swap's two renames
        assert pin.replaced()

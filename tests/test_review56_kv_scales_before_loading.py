"""KV scales checked from the checkpoint's tensor names before any weight loads: a layer with only
one of k_scale / v_scale is the loader's own CheckpointError (exit 4) under fp8_e4m3 too (it was
"needs calibrated k/v scales", exit 3), and `sweep --kv-cache-dtype fp8_e4m3` without scales is
refused before loading, as run, eval and bench refuse it (it loaded the model first)."""

import pytest
import torch

from conftest import run_cli, tiny_config
from salactl.bench.sweep_job import SweepSettings, run_sweep
from salactl.errors import CheckpointError, ConfigError
from salactl.runtime.checkpoint import random_state_dict
from salactl.runtime.checkpoint_write import save_checkpoint
from salactl.runtime.loader import load_model

SWEEP = dict(device="cpu", kl=False, passkey=False, requests=1, input_len=8, output_len=2)


def _checkpoint(path, **extra):
    cfg = tiny_config()
    state = random_state_dict(cfg, "cpu", torch.float32, 0)
    state.update(extra)
    return save_checkpoint(state, cfg.to_hf_dict(), path)


def test_half_a_scale_pair_is_the_loaders_error_before_loading(tmp_path, capsys):
    layer = tiny_config().sparse_layers[0]
    ckpt = _checkpoint(tmp_path / "half", **{f"model.layers.{layer}.self_attn.k_scale": torch.tensor(0.01)})
    with pytest.raises(CheckpointError) as loader:
        load_model(ckpt, "cpu")
    assert str(loader.value) == f"layer {layer} has only one of self_attn.k_scale / v_scale"
    for kv in ("fp8_e4m3", "fp8_e5m2"):
        code, _, err = run_cli(["run", "--model", ckpt, "--prompt-ids", "1,2,3", "--max-new-tokens", "1",
                                "--kv-cache-dtype", kv], capsys)
        assert code == 4 and err.strip().splitlines()[-1] == f"error: {loader.value}", (kv, err)


@pytest.fixture(scope="module")
def unloadable_checkpoint(tmp_path_factory):
    """No KV scales, and a tensor of the wrong shape: whatever loads the weights fails (exit 4)."""
    return _checkpoint(tmp_path_factory.mktemp("kv") / "ckpt", **{"model.norm.weight": torch.ones(3)})


def test_sweep_refuses_e4m3_without_scales_before_loading(unloadable_checkpoint, tmp_path, capsys):
    with pytest.raises(ConfigError, match=r"^no point could be measured \(--kv-cache-dtype fp8_e4m3 needs "
                                          "calibrated k/v scales"):
        run_sweep(SweepSettings(model=unloadable_checkpoint, kv_dtype="fp8_e4m3", out=tmp_path / "a", **SWEEP))
    assert not (tmp_path / "a").exists()
    code, _, err = run_cli(["sweep", "--model", unloadable_checkpoint, "--device", "cpu", "--kv-cache-dtype",
                            "fp8_e4m3", "--no-kl", "--no-passkey", "--out", tmp_path / "b"], capsys)
    assert code == 3 and "needs calibrated k/v scales" in err, err
    # a grid with a dtype that needs no scales loads the model (its fp8_e4m3 points are skipped after)
    with pytest.raises(CheckpointError, match="model.norm.weight"):
        run_sweep(SweepSettings(model=unloadable_checkpoint, kv_dtype="bf16,fp8_e4m3", out=tmp_path / "c",
                                **SWEEP))

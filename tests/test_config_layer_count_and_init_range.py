"""A config.json that claims layers its checkpoint does not hold is refused from the tensor names alone
(never by listing every claimed layer's tensors), and initializer_range is validated like the other numbers."""

import json

import pytest
import torch

from conftest import run_cli
from salactl.errors import CheckpointError, ConfigError
from salactl.runtime.checkpoint import random_state_dict
from salactl.runtime.checkpoint_write import save_checkpoint
from salactl.runtime.config import LIGHTNING, SPARSE, SalaConfig, SparseConfig
from salactl.runtime.loader import load_model

# hidden size 8: 50,000 such layers pass the CLI's memory check, so loading is what refuses them
SMALL = SalaConfig(vocab_size=16, hidden_size=8, intermediate_size=8, num_hidden_layers=8, num_attention_heads=1,
                   num_key_value_heads=1, head_dim=8, mixer_types=(SPARSE,) + (LIGHTNING,) * 7, lightning_nh=1,
                   lightning_nkv=1, lightning_head_dim=8, dim_model_base=8,
                   sparse_config=SparseConfig(block_size=16, dense_len=40, init_blocks=1, kernel_size=8,
                                              kernel_stride=4, topk=1, window_size=16))


def _checkpoint(tmp_path, drop_layer=None, **config_changes):
    """An 8-layer model saved for real, optionally without every tensor of one layer, with config.json
    keys overridden."""
    cfg = SMALL
    state = random_state_dict(cfg, "cpu", torch.float32, 0)
    if drop_layer is not None:
        state = {n: t for n, t in state.items() if not n.startswith(f"model.layers.{drop_layer}.")}
    out = save_checkpoint(state, cfg.to_hf_dict(), tmp_path / "ckpt")
    d = json.loads((out / "config.json").read_text())
    d.update(config_changes)
    (out / "config.json").write_text(json.dumps(d))
    return out


def _claiming(tmp_path, layers, **more):
    return _checkpoint(tmp_path, num_hidden_layers=layers,
                       mixer_types=["minicpm4"] + [LIGHTNING] * (layers - 1), **more)


# 50,000 claimed layers cost under a second either way; the message says which path refused them
def test_more_layers_than_the_checkpoint_holds_are_refused_naming_the_count(tmp_path):
    path = _claiming(tmp_path, 50_000)
    with pytest.raises(CheckpointError) as e:
        load_model(str(path), "cpu", "float32")
    msg = str(e.value)
    assert "lacks tensor model.layers.8.input_layernorm.weight and every other tensor of layer 8" in msg
    assert "(and of 49991 more layers)" in msg
    assert "num_hidden_layers is 50000 but the checkpoint holds tensors of 8 of them" in msg


def test_cli_refuses_them_in_one_line_with_exit_4(tmp_path, capsys):
    path = _claiming(tmp_path, 50_000)
    code, out, err = run_cli(["run", "--model", path, "--prompt-ids", "1,2", "--max-new-tokens", "1", "--json"],
                             capsys)
    assert code == 4 and out == ""
    assert len(err.strip().splitlines()) == 1 and "num_hidden_layers is 50000" in err


def test_a_gptq_config_is_refused_the_same_way_before_gptq_loading(tmp_path):
    qc = {"quant_method": "gptq", "bits": 4, "group_size": 128, "desc_act": False, "sym": True}
    path = _claiming(tmp_path, 50_000, quantization_config=qc)
    with pytest.raises(CheckpointError, match="num_hidden_layers is 50000"):
        load_model(str(path), "cpu", "float32")


def test_one_absent_middle_layer_is_named(tmp_path):
    path = _checkpoint(tmp_path, drop_layer=3)
    with pytest.raises(CheckpointError) as e:
        load_model(str(path), "cpu", "float32")
    msg = str(e.value)
    assert "lacks tensor model.layers.3.input_layernorm.weight and every other tensor of layer 3:" in msg
    assert "num_hidden_layers is 8 but the checkpoint holds tensors of 7 of them" in msg


@pytest.mark.parametrize("value", [float("nan"), -0.02, 0, float("inf")])
def test_bad_initializer_range_is_a_config_error_with_random_weights(tmp_path, value):
    path = _checkpoint(tmp_path, initializer_range=value)
    with pytest.raises(ConfigError, match="config.initializer_range must be a positive finite number"):
        load_model(str(path), "cpu", "float32", random_weights=True)


def test_bad_initializer_range_cli_is_one_line_exit_3(tmp_path, capsys):
    path = _checkpoint(tmp_path, initializer_range=float("nan"))
    code, _, err = run_cli(["run", "--model", path, "--random-weights", "--prompt-ids", "1,2",
                            "--max-new-tokens", "1", "--json"], capsys)
    assert code == 3
    assert err.strip().splitlines() == ["error: config.initializer_range must be a positive finite number, got nan"]


def test_an_integer_past_float_range_is_refused():
    d = SMALL.to_hf_dict() | {"initializer_range": 10 ** 400}
    with pytest.raises(ConfigError, match="initializer_range must be a positive finite number, got an integer"):
        SalaConfig.from_hf_dict(d)


def test_a_real_initializer_range_keeps_loading(tmp_path):
    path = _checkpoint(tmp_path, initializer_range=0.02)
    loaded = load_model(str(path), "cpu", "float32")
    assert loaded.config.initializer_range == 0.02
    assert load_model(str(path), "cpu", "float32", random_weights=True).config.initializer_range == 0.02

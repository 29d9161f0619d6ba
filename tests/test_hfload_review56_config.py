"""Top-level config.json keys that transformers' Llama-family code reads and that change the maths
(partial_rotary_factor, rope_type, mlp_bias) are refused unless they state what salactl runs, as the
same keys inside rope_scaling / rope_parameters are; the real MiniCPM-SALA config still parses."""

import json
import shutil
from pathlib import Path

import pytest

from salactl.errors import ConfigError
from salactl.runtime.config import SalaConfig
from salactl.runtime.loader import EMBEDDED_DIR
from salactl.runtime.presets import sala_9b
from conftest import run_cli

NANO = SalaConfig.from_file(EMBEDDED_DIR / "config.json")


@pytest.fixture
def nano(tmp_path):
    return Path(shutil.copytree(EMBEDDED_DIR, tmp_path / "nano"))


def with_keys(path: Path, **keys) -> Path:
    d = json.loads((path / "config.json").read_text())
    d.update(keys)
    (path / "config.json").write_text(json.dumps(d))
    return path


def run(model, capsys) -> tuple[int, str]:
    code, _, err = run_cli(["run", "--model", model, "-p", "def f(x):", "-n", 8, "--device", "cpu", "--json"],
                           capsys)
    return code, err


@pytest.mark.parametrize("key,value", [
    ("partial_rotary_factor", 0.5),
    ("partial_rotary_factor", 0),
    ("partial_rotary_factor", "1.0"),
    ("partial_rotary_factor", True),           # json true, not the number 1
    ("rope_type", "yarn"),
    ("mlp_bias", True),
    ("mlp_bias", "false"),                     # a non-empty string is a bias in nn.Linear
])
def test_a_top_level_key_that_changes_the_maths_is_exit_3(nano, key, value, capsys):
    with_keys(nano, **{key: value})
    msg = f"config.json has {key} = {json.dumps(value)}, which salactl does not implement"
    with pytest.raises(ConfigError, match=msg):
        SalaConfig.from_file(nano / "config.json")
    code, err = run(nano, capsys)
    assert code == 3 and err.count("\n") == 1 and msg in err, err


@pytest.mark.parametrize("keys", [
    {"partial_rotary_factor": 1.0, "rope_type": "default", "mlp_bias": False},
    {"partial_rotary_factor": 1, "rope_type": None, "mlp_bias": None},
    {"partial_rotary_factor": None},
    {"mlp_bias": 0},                          # nn.Linear(bias=0) has none
])
def test_top_level_keys_that_state_salactls_maths_read_as_the_plain_config(nano, keys, capsys):
    with_keys(nano, **keys)
    cfg = SalaConfig.from_file(nano / "config.json")
    assert cfg == NANO and SalaConfig.from_hf_dict(cfg.to_hf_dict()) == cfg
    code, err = run(nano, capsys)
    assert code == 0, err


def test_a_full_partial_rotary_factor_in_rope_parameters_without_rope_type_is_plain_rope(nano):
    """transformers-5 rope_parameters carry partial_rotary_factor; 1.0 is the default RoPE whether or
    not rope_type is spelled out (before, only the spelled-out form passed)."""
    with_keys(nano, rope_parameters={"rope_theta": 10000.0, "partial_rotary_factor": 1.0})
    assert SalaConfig.from_file(nano / "config.json") == NANO
    with_keys(nano, rope_parameters={"rope_theta": 10000.0, "partial_rotary_factor": 0.5})
    with pytest.raises(ConfigError, match="config.rope_parameters has partial_rotary_factor"):
        SalaConfig.from_file(nano / "config.json")


def test_the_real_minicpm_sala_config_json_reads_as_the_sala_9b_preset():
    """Every key of openbmb/MiniCPM-SALA's config.json (reference/architecture.md §1), the ones
    salactl does not read (mup_denominator, pretraining_tp, shift_labels, ...) included."""
    sparse = [0, 9, 16, 17, 22, 29, 30, 31]
    real = {
        "architectures": ["MiniCPMSALAForCausalLM"], "model_type": "minicpm_sala",
        "auto_map": {"AutoConfig": "configuration_minicpm_sala.MiniCPMSALAConfig",
                     "AutoModelForCausalLM": "modeling_minicpm_sala.MiniCPMSALAForCausalLM"},
        "hidden_size": 4096, "intermediate_size": 16384, "hidden_act": "silu", "num_hidden_layers": 32,
        "num_attention_heads": 32, "num_key_value_heads": 2, "head_dim": 128, "vocab_size": 73448,
        "rope_theta": 10000.0, "rope_scaling": None, "max_position_embeddings": 524288, "rms_norm_eps": 1e-06,
        "scale_emb": 12, "scale_depth": 1.4, "dim_model_base": 256, "mup_denominator": 32,
        "attention_bias": False, "attention_dropout": 0.0, "pretraining_tp": 1,
        "attn_use_rope": False, "attn_use_output_gate": True,
        "lightning_nh": 32, "lightning_nkv": 32, "lightning_head_dim": 128,
        "lightning_scale": "1/sqrt(d)", "lightning_use_rope": True,
        "qk_norm": True, "use_output_norm": True, "use_output_gate": True,
        "sparse_config": {"block_size": 64, "dense_len": 8192, "init_blocks": 1, "kernel_size": 32,
                          "kernel_stride": 16, "topk": 64, "use_nope": False, "window_size": 2048},
        "mixer_types": ["minicpm4" if i in sparse else "lightning-attn" for i in range(32)],
        "bos_token_id": 1, "eos_token_id": [2, 73440], "pad_token_id": 2, "tie_word_embeddings": False,
        "dtype": "bfloat16", "initializer_range": 0.1, "use_cache": True, "shift_labels": True,
        "transformers_version": "4.57.1",
    }
    assert SalaConfig.from_hf_dict(real) == sala_9b()

"""Malformed config.json, safetensors index, tokenizer_config.json and quantization_config: each is a
one-line error of its own class (exit 3 config, 4 checkpoint, 5 tokenizer) naming what is wrong."""

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from salactl.errors import CheckpointError, ConfigError, TokenizerError
from salactl.quant.loading import parse_quant_config
from salactl.runtime.config import SalaConfig
from salactl.runtime.loader import EMBEDDED_DIR, load_model
from salactl.runtime.tokenizer import Tokenizer
from conftest import run_cli

INDEX = "model.safetensors.index.json"


def run_err(args, capsys):
    code, _, err = run_cli(args, capsys)
    return code, err


def run_prompt(model, capsys):
    return run_err(["run", "--model", model, "--prompt", "hi", "-n", 1, "--device", "cpu"], capsys)


def edit_json(path: Path, change) -> Path:
    """Apply `change` to the parsed file (it edits in place, or returns a replacement)."""
    d = json.loads(path.read_text())
    new = change(d)
    path.write_text(json.dumps(d if new is None else new))
    return path.parent


@pytest.fixture
def nano(tmp_path):
    return Path(shutil.copytree(EMBEDDED_DIR, tmp_path / "nano"))


@pytest.mark.parametrize("key,value,expected", [
    ("vocab_size", "abc", "an integer"),
    ("vocab_size", None, "an integer"),
    ("vocab_size", [1], "an integer"),
    ("hidden_size", True, "an integer"),
    ("head_dim", 32.0, "an integer"),
    ("max_position_embeddings", "abc", "an integer"),
    ("bos_token_id", "1", "an integer"),
    ("eos_token_id", "abc", "an integer or a list of integers"),
    ("eos_token_id", None, "an integer or a list of integers"),
    ("eos_token_id", [2, None], "an integer or a list of integers"),
    ("scale_depth", "x", "a number"),
    ("rope_theta", "x", "a number"),
    ("initializer_range", [0.02], "a number"),
    ("rms_norm_eps", False, "a number"),
    ("qk_norm", "true", "true or false"),
    ("hidden_act", 1, "a string"),
    ("torch_dtype", 16, "a string"),
])
def test_wrong_config_value_types_name_key_value_and_expectation(nano, key, value, expected):
    edit_json(nano / "config.json", lambda d: d.update({key: value}))
    with pytest.raises(ConfigError) as e:
        SalaConfig.from_file(nano / "config.json")
    assert str(e.value) == f"config.json has {key} = {json.dumps(value)}; expected {expected}"


@pytest.mark.parametrize("key,value,expected", [("topk", "4", "an integer"), ("block_size", 32.0, "an integer"),
                                                ("use_nope", 0, "true or false")])
def test_wrong_sparse_config_value_types(nano, key, value, expected):
    edit_json(nano / "config.json", lambda d: d["sparse_config"].update({key: value}))
    with pytest.raises(ConfigError, match=f"sparse_config.{key} = .*; expected {expected}$"):
        SalaConfig.from_file(nano / "config.json")


def test_null_optional_config_keys_keep_their_defaults(nano):
    edit_json(nano / "config.json", lambda d: d.update(rope_theta=None, lightning_nh=None, pad_token_id=None,
                                                        rope_theta_unused=1))
    cfg = SalaConfig.from_file(nano / "config.json")
    assert cfg.rope_theta == 10000.0 and cfg.lightning_nh == 8 and cfg.pad_token_id == 2


def test_zero_heads_without_head_dim_is_a_config_error(nano):
    edit_json(nano / "config.json", lambda d: {**d, "head_dim": None, "num_attention_heads": 0})
    with pytest.raises(ConfigError, match="num_attention_heads must be positive"):
        SalaConfig.from_file(nano / "config.json")


def test_bad_config_type_via_cli_is_one_line_exit_3(nano, capsys):
    edit_json(nano / "config.json", lambda d: d.update(vocab_size="abc"))
    code, err = run_prompt(nano, capsys)
    assert code == 3 and err == 'error: config.json has vocab_size = "abc"; expected an integer\n', err


@pytest.mark.parametrize("change,msg", [
    (lambda d: d.update(weight_map=list(d["weight_map"])), "has a 'weight_map' that is a list, not an object"),
    (lambda d: d["weight_map"].update({"model.norm.weight": 2}), "maps tensor model.norm.weight to 2, not a shard"),
    (lambda d: d["weight_map"].update({"model.norm.weight": ""}), 'maps tensor model.norm.weight to "", not a'),
    (lambda d: [d], "is not a valid safetensors index"),
    (lambda d: d["weight_map"].update({"model.norm.weight": "model-00001-of-00002.safetensors"}),
     f"{INDEX} maps tensor model.norm.weight to model-00001-of-00002.safetensors, but that shard does not "
     "contain it; fix the index's weight_map"),
])
def test_malformed_index_is_a_checkpoint_error(nano, change, msg):
    assert json.loads((nano / INDEX).read_text())["weight_map"]["model.norm.weight"].startswith("model-00002")
    edit_json(nano / INDEX, change)
    with pytest.raises(CheckpointError) as e:
        load_model(str(nano), "cpu", "float32")
    assert msg in str(e.value) and "\n" not in str(e.value)


def test_wrong_shard_via_cli_blames_the_index_exit_4(nano, capsys):
    edit_json(nano / INDEX, lambda d: d["weight_map"].update({"lm_head.weight": "model-00001-of-00002.safetensors"}))
    code, err = run_prompt(nano, capsys)
    assert code == 4 and "maps tensor lm_head.weight to model-00001-of-00002.safetensors, but that shard" in err
    assert "not a complete safetensors file" not in err and len(err.splitlines()) == 1


@pytest.mark.parametrize("content,msg", [
    ("[1, 2]", "must hold a JSON object, not a list"),
    ('{"bos_token": 5}', 'has bos_token = 5; expected a token string'),
    ('{"eos_token": {"content": 3}}', 'has eos_token = {"content": 3}; expected a token string'),
    ('{"add_bos_token": "yes"}', 'has add_bos_token = "yes"; expected true or false'),
    ('{"bos_token": ', "is not valid JSON"),
])
def test_malformed_tokenizer_config_is_a_tokenizer_error(nano, content, msg):
    (nano / "tokenizer_config.json").write_text(content)
    with pytest.raises(TokenizerError, match="tokenizer_config.json") as e:
        Tokenizer(nano)
    assert msg in str(e.value)


def test_tokenizer_config_token_objects_and_nulls_still_work(nano):
    (nano / "tokenizer_config.json").write_text(json.dumps({"bos_token": {"content": "<s>"}, "eos_token": None}))
    tok = Tokenizer(nano)
    assert tok.bos_id == 1 and tok.eos_ids == (2, 4) and tok.add_bos


def test_malformed_tokenizer_config_via_cli_is_exit_5(nano, capsys):
    (nano / "tokenizer_config.json").write_text('{"bos_token": 5}')
    code, err = run_prompt(nano, capsys)
    assert code == 5 and err.startswith("error: ") and "has bos_token = 5" in err and len(err.splitlines()) == 1


QC = {"quant_method": "gptq", "bits": 4, "group_size": 128, "sym": True}


@pytest.mark.parametrize("dynamic,msg", [
    ([".*q_proj.*"], "quantization_config.dynamic is a list; expected an object"),
    ({"+:.*q_proj.*": 4}, "quantization_config.dynamic rule '+:.*q_proj.*' maps to 4; expected an object"),
    ({".*q_proj.*": [4]}, "rule '.*q_proj.*' maps to [4]; expected an object"),
    ({"+:.*q_proj.*": {"bits": 8}}, "changes bits/group_size/sym"),
])
def test_malformed_dynamic_quant_rules(dynamic, msg):
    with pytest.raises(CheckpointError) as e:
        parse_quant_config({**QC, "dynamic": dynamic})
    assert msg in str(e.value)


@pytest.mark.parametrize("qc", [{"bits": 4.0}, {"bits": True}, {"group_size": True}])
def test_quant_bits_and_group_size_must_be_integers(qc):
    with pytest.raises(CheckpointError, match="bits|group_size"):
        parse_quant_config({**QC, **qc})


def test_valid_dynamic_rules_still_parse():
    spec = parse_quant_config({**QC, "dynamic": {"-:.*lm_head.*": {}, "+:.*q_proj.*": {"bits": 4}}})
    assert spec["bits"] == 4 and spec["group_size"] == 128


@pytest.mark.parametrize("dynamic,msg", [([".*q_proj.*"], "dynamic is a list"), ({"+:.*q_proj.*": 4}, "maps to 4")])
def test_malformed_dynamic_in_a_gptq_checkpoint_via_cli_is_exit_4(nano_rtn_dir, tmp_path, dynamic, msg, capsys):
    bad = Path(shutil.copytree(nano_rtn_dir, tmp_path / "bad"))
    edit_json(bad / "config.json", lambda d: d["quantization_config"].update(dynamic=dynamic))
    capsys.readouterr()
    code, err = run_prompt(bad, capsys)
    assert code == 4 and msg in err and len(err.splitlines()) == 1, err


def test_gptq_tensor_in_the_wrong_shard_blames_the_index(nano_rtn_dir, tmp_path):
    bad = Path(shutil.copytree(nano_rtn_dir, tmp_path / "bad"))
    with safe_open(bad / "model.safetensors", framework="pt") as f:
        names = list(f.keys())
    victim = next(n for n in names if n.endswith(".qweight"))
    save_file({"dummy": torch.zeros(1)}, str(bad / "other.safetensors"))
    weight_map = {n: "model.safetensors" for n in names} | {victim: "other.safetensors"}
    (bad / INDEX).write_text(json.dumps({"weight_map": weight_map}))
    with pytest.raises(CheckpointError, match=f"{INDEX} maps tensor {victim} to other.safetensors, but that shard"):
        load_model(str(bad), "cpu", "float32")

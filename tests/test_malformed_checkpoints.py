"""Malformed config.json, safetensors index, tokenizer_config.json and quantization_config: each is a
one-line error of its own class (exit 3 config, 4 checkpoint, 5 tokenizer) naming what is wrong."""

import json
import math
import shutil
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from salactl.errors import CapacityError, CheckpointError, ConfigError, TokenizerError
from salactl.quant.loading import parse_quant_config
from salactl.runtime.config import SalaConfig
from salactl.runtime.loader import EMBEDDED_DIR, load_model
from salactl.runtime.tokenizer import Tokenizer, check_fits
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
    ({"+:(": {"bits": 4}}, "quantization_config.dynamic rule '+:(' is not a valid regular expression"),
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
    (bad / "model.safetensors").rename(bad / "main.safetensors")     # model.safetensors would win over an index
    save_file({"dummy": torch.zeros(1)}, str(bad / "other.safetensors"))
    weight_map = {n: "main.safetensors" for n in names} | {victim: "other.safetensors", "dummy": "other.safetensors"}
    (bad / INDEX).write_text(json.dumps({"weight_map": weight_map}))
    with pytest.raises(CheckpointError, match=f"{INDEX} maps tensor {victim} to other.safetensors, but that shard"):
        load_model(str(bad), "cpu", "float32")


# ------------------------------------------------------------------ index: shard paths, unlisted tensors
@pytest.mark.parametrize("shard", ["../model-00002-of-00002.safetensors", "sub/../model-00002-of-00002.safetensors",
                                   "/dev/zero", "/etc/passwd"])
def test_index_shard_outside_the_model_dir_is_refused_by_name(nano, shard):
    edit_json(nano / INDEX, lambda d: d["weight_map"].update({"model.norm.weight": shard}))
    with pytest.raises(CheckpointError) as e:
        load_model(str(nano), "cpu", "float32")
    assert f"maps tensor model.norm.weight to {shard}, outside the model directory" in str(e.value)


def test_symlinked_shards_still_load(nano, tmp_path):
    store = tmp_path / "blobs"
    store.mkdir()
    for shard in nano.glob("model-*.safetensors"):
        shard.rename(store / shard.name)
        shard.symlink_to(store / shard.name)
    assert load_model(str(nano), "cpu", "float32").config.vocab_size == 4096


def test_missing_shard_message_shows_the_path_looked_up(nano):
    (nano / "model-00002-of-00002.safetensors").unlink()
    with pytest.raises(CheckpointError, match=f"shard {nano}/model-00002-of-00002.safetensors named in {INDEX} "
                                              "does not exist"):
        load_model(str(nano), "cpu", "float32")


def _add_to_shard(nano, name):
    shard = nano / "model-00001-of-00002.safetensors"
    with safe_open(shard, framework="pt") as f:
        tensors = {n: f.get_tensor(n) for n in f.keys()}
    save_file({**tensors, name: torch.zeros(4)}, str(shard))


def test_shard_tensor_the_index_does_not_list_is_refused(nano):
    _add_to_shard(nano, "model.layers.0.self_attn.extra_bias")
    with pytest.raises(CheckpointError, match="holds tensor model.layers.0.self_attn.extra_bias, which "
                                              f"{INDEX} does not list for it"):
        load_model(str(nano), "cpu", "float32")


def test_an_unlisted_rope_buffer_in_a_shard_is_ignored_as_listed_ones_are(nano):
    _add_to_shard(nano, "model.layers.1.self_attn.rotary_emb.inv_freq")
    load_model(str(nano), "cpu", "float32")


def test_model_safetensors_wins_over_an_index_as_in_transformers(nano):
    save_file({"x": torch.zeros(1)}, str(nano / "model.safetensors"))
    with pytest.raises(CheckpointError, match="lacks tensor"):         # the index's complete shards are not used
        load_model(str(nano), "cpu", "float32")


# ------------------------------------------------------------------ weights that are not floating point
@pytest.mark.parametrize("dtype,name", [(torch.int8, "I8"), (torch.bool, "BOOL"), (torch.float8_e4m3fn, "F8_E4M3")])
def test_non_float_full_precision_tensor_is_refused(nano, dtype, name):
    shard = nano / "model-00001-of-00002.safetensors"
    with safe_open(shard, framework="pt") as f:
        tensors = {n: f.get_tensor(n) for n in f.keys()}
    tensors["model.layers.0.mlp.up_proj.weight"] = tensors["model.layers.0.mlp.up_proj.weight"].to(dtype)
    save_file(tensors, str(shard))
    with pytest.raises(CheckpointError, match=f"tensor model.layers.0.mlp.up_proj.weight has dtype {name}; .* "
                                              "a quantized checkpoint needs its quantization_config"):
        load_model(str(nano), "cpu", "float32")


# ------------------------------------------------------------------ JSON side files that are not UTF-8 or too deep
BAD_JSON = [(b"\xff\xfe\x00garbage", "is not UTF-8 text"), (b"[" * 100000 + b"]" * 100000, "nests JSON")]


@pytest.mark.parametrize("file,code", [("config.json", 3), (INDEX, 4), ("generation_config.json", 4),
                                       ("tokenizer_config.json", 5)])
@pytest.mark.parametrize("content,msg", BAD_JSON)
def test_undecodable_side_files_are_one_line_with_their_exit_code(nano, capsys, file, code, content, msg):
    (nano / file).write_bytes(content)
    got, err = run_prompt(nano, capsys)
    assert got == code and f"{nano / file} {msg}" in err and len(err.splitlines()) == 1, err


@pytest.mark.parametrize("content,msg", BAD_JSON)
def test_undecodable_quantize_config_is_a_checkpoint_error(nano, content, msg):
    (nano / "quantize_config.json").write_bytes(content)
    with pytest.raises(CheckpointError, match=msg):
        load_model(str(nano), "cpu", "float32")


# ------------------------------------------------------------------ config numbers
@pytest.mark.parametrize("key,value", [("rope_theta", -10000.0), ("rope_theta", 0), ("rope_theta", float("nan")),
                                       ("rope_theta", float("inf")), ("rms_norm_eps", float("nan")),
                                       ("scale_depth", -1.4), ("scale_depth", float("nan")),
                                       ("scale_emb", float("inf")), ("dim_model_base", 0)])
def test_config_numbers_must_be_positive_and_finite(nano, key, value):
    edit_json(nano / "config.json", lambda d: d.update({key: value}))
    with pytest.raises(ConfigError, match=f"^config.{key} must be a positive finite number, got"):
        SalaConfig.from_file(nano / "config.json")


@pytest.mark.parametrize("value", [0, -5])
def test_max_position_embeddings_must_be_at_least_one(nano, value):
    edit_json(nano / "config.json", lambda d: d.update(max_position_embeddings=value))
    with pytest.raises(ConfigError, match=f"max_position_embeddings must be at least 1, got {value}"):
        SalaConfig.from_file(nano / "config.json")


@pytest.mark.parametrize("key", ["bos_token_id", "eos_token_id"])
def test_special_token_id_at_the_vocabulary_size_is_refused(nano, key):
    """A config.json bos/eos id equal to vocab_size (one past the last id) is a config error, not an index error."""
    edit_json(nano / "config.json", lambda d: d.update({key: d["vocab_size"]}))
    with pytest.raises(ConfigError, match=r"special token id 4096 is outside the vocabulary \(size 4096\)"):
        SalaConfig.from_file(nano / "config.json")


@pytest.mark.parametrize("key", ["num_key_value_heads", "head_dim", "lightning_nh", "lightning_nkv",
                                 "lightning_head_dim"])
def test_zero_head_counts_are_not_read_as_missing(nano, key):
    edit_json(nano / "config.json", lambda d: d.update({key: 0}))
    with pytest.raises(ConfigError, match=f"config.{key} must be positive, got 0"):
        SalaConfig.from_file(nano / "config.json")


def test_huge_layer_count_is_sized_without_a_per_tensor_dict(nano):
    import time

    from salactl.runtime.checkpoint import expected_tensor_shapes
    from salactl.runtime.presets import sala_9b

    for cfg in (sala_9b(), SalaConfig.from_file(nano / "config.json")):
        assert cfg.parameter_count() == sum(math.prod(s) for s in expected_tensor_shapes(cfg).values())
    n = 10 ** 6
    edit_json(nano / "config.json", lambda d: d.update(num_hidden_layers=n,
                                                        mixer_types=["minicpm4"] + ["lightning-attn"] * (n - 1)))
    start = time.perf_counter()
    with pytest.raises(CapacityError):
        load_model(str(nano), "cpu", "float32")
    assert time.perf_counter() - start < 10         # ~1 s on a loaded 2-core machine; was 28 s (a 12M-entry shape dict)


# ------------------------------------------------------------------ sparse_config
@pytest.mark.parametrize("change,msg", [
    (lambda d: (d.pop("sparse_config"), None)[1], "has no sparse_config, which the minicpm4 layers need"),
    (lambda d: d.update(sparse_config=None), "has no sparse_config, which the minicpm4 layers need"),
    (lambda d: (d["sparse_config"].pop("topk"), None)[1], r"sparse_config lacks \['topk'\]"),
    (lambda d: (d["sparse_config"].pop("dense_len"), d["sparse_config"].pop("window_size"), None)[2],
     r"sparse_config lacks \['dense_len', 'window_size'\]"),
])
def test_missing_sparse_config_or_keys_are_refused(nano, change, msg):
    edit_json(nano / "config.json", change)
    with pytest.raises(ConfigError, match=msg):
        SalaConfig.from_file(nano / "config.json")


def test_sparse_config_may_omit_use_nope(nano):
    edit_json(nano / "config.json", lambda d: (d["sparse_config"].pop("use_nope"), None)[1])
    assert SalaConfig.from_file(nano / "config.json").sparse_config.use_nope is False


# ------------------------------------------------------------------ FP8 KV scales
def test_infinite_kv_scale_is_refused_at_load(tmp_path):
    from conftest import tiny_config
    from salactl.runtime.checkpoint import random_state_dict
    from salactl.runtime.checkpoint_write import save_checkpoint

    cfg = tiny_config()
    state = random_state_dict(cfg, "cpu", torch.float32, 0)
    layer = cfg.sparse_layers[0]
    state[f"model.layers.{layer}.self_attn.k_scale"] = torch.tensor(float("inf"))
    state[f"model.layers.{layer}.self_attn.v_scale"] = torch.tensor(0.05)
    path = save_checkpoint(state, cfg.to_hf_dict(), tmp_path / "ckpt")
    with pytest.raises(CheckpointError, match="k_scale must be a positive finite float"):
        load_model(str(path), "cpu", "float32")


def test_kv_scale_error_reports_the_stored_shape():
    from conftest import tiny_config
    from salactl.runtime.kv_fp8 import resolve_kv_scales

    cfg = tiny_config()
    bad = (torch.tensor(float("inf")), torch.tensor(1.0))
    with pytest.raises(ConfigError, match=r"got shape \[\] with values \[inf\]"):
        resolve_kv_scales(cfg, "fp8_e4m3", {i: bad for i in cfg.sparse_layers}, "cpu")


# ------------------------------------------------------------------ generation_config.json
@pytest.mark.parametrize("content,msg", [
    ("[1]", "must hold a JSON object, not a list"),
    ('{"eos_token_id": [99999, -3]}', "has eos_token_id 99999, outside the model's vocabulary [0, 4096)"),
    ('{"eos_token_id": -3}', "has eos_token_id -3, outside"),
    ('{"eos_token_id": [2, 4096]}', "has eos_token_id 4096, outside the model's vocabulary [0, 4096)"),  # == vocab
])
def test_bad_generation_config_is_refused_at_load(nano, capsys, content, msg):
    (nano / "generation_config.json").write_text(content)
    code, err = run_prompt(nano, capsys)
    assert code == 4 and f"{nano}/generation_config.json {msg}" in err and len(err.splitlines()) == 1, err


# ------------------------------------------------------------------ tokenizer vocabulary
def test_tokenizer_with_only_special_tokens_is_refused(nano):
    edit_json(nano / "tokenizer.json", lambda d: d["model"].update(vocab={}, merges=[]))
    with pytest.raises(TokenizerError, match="has no tokens besides its special tokens"):
        Tokenizer(nano)


@pytest.mark.parametrize("key", ["bos_token", "eos_token", "unk_token", "pad_token"])
def test_tokenizer_config_special_token_missing_from_vocabulary_is_named(nano, key):
    """As in HF, the token is appended as a new id; past the model's vocabulary that is refused,
    naming the token (not only the sizes)."""
    edit_json(nano / "tokenizer_config.json", lambda d: d.update({key: "<notintokenizer>"}))
    tok = Tokenizer(nano)
    assert tok.tok.token_to_id("<notintokenizer>") == 4096
    with pytest.raises(TokenizerError, match=f'tokenizer_config.json\'s {key} "<notintokenizer>" is not in '
                                             "tokenizer.json, so it was added as a new id"):
        check_fits(tok, 4096)
    check_fits(tok, 4097)                                    # room for it in the embedding: fine

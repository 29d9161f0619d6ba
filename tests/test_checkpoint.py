"""HF checkpoint round trip (single file and sharded) and strict loading errors."""

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from salactl.errors import CheckpointError, ConfigError
from salactl.runtime.checkpoint import expected_tensor_shapes, random_state_dict
from salactl.runtime.checkpoint_write import check_output_dir, save_checkpoint
from salactl.runtime.config import SalaConfig
from salactl.runtime.engine import Engine
from salactl.runtime.loader import build_model, load_model
from salactl.runtime.presets import preset, sala_9b
from conftest import tiny_config


def write_tiny(tmp_path, shard_bytes=4 << 30, seed=0):
    cfg = tiny_config()
    state = random_state_dict(cfg, "cpu", torch.float32, seed)
    out = save_checkpoint(state, cfg.to_hf_dict(), tmp_path / "ckpt", max_shard_bytes=shard_bytes)
    return cfg, state, out


def logits(model, ids):
    eng = Engine(model, "cpu", chunk_size=64)
    return eng.prefill(eng.new_sequence(), ids, all_logits=True)


@pytest.mark.parametrize("shard_bytes", [4 << 30, 1 << 20])
def test_round_trip_logits_exact(tmp_path, shard_bytes):
    cfg, state, path = write_tiny(tmp_path, shard_bytes)
    if shard_bytes < (4 << 30):
        assert (path / "model.safetensors.index.json").exists()
    ids = list(range(1, 300))
    want = logits(build_model(cfg, state), ids)
    got = logits(load_model(str(path), "cpu", "float32").model, ids)
    assert torch.equal(got, want)


def test_real_9b_shapes_total_parameter_count():
    assert sala_9b().parameter_count() == 9_477_203_968
    names = expected_tensor_shapes(sala_9b())
    assert names["model.layers.0.self_attn.o_gate.weight"] == (4096, 4096)
    assert names["model.layers.1.self_attn.z_proj.weight"] == (4096, 4096)
    assert names["model.layers.0.self_attn.k_proj.weight"] == (256, 4096)
    assert names["model.layers.1.self_attn.o_norm.weight"] == (4096,)


def _edit_single(path, fn):
    f = path / "model.safetensors"
    tensors = load_file(f)
    fn(tensors)
    save_file(tensors, f)


@pytest.mark.parametrize("damage", ["truncated", "garbage"])
@pytest.mark.parametrize("shard_bytes", [4 << 30, 1 << 20])
def test_corrupt_safetensors_is_a_checkpoint_error_naming_the_file(tmp_path, damage, shard_bytes):
    _, _, path = write_tiny(tmp_path, shard_bytes=shard_bytes)
    victim = sorted(path.glob("*.safetensors"))[-1]
    if damage == "truncated":
        os.truncate(victim, victim.stat().st_size // 2)
    else:
        victim.write_bytes(os.urandom(100))
    with pytest.raises(CheckpointError, match=f"{victim.name} is not a complete safetensors file"):
        load_model(str(path), "cpu", "float32")


def test_a_checkpoint_without_its_tokenizer_is_a_tokenizer_error(tmp_path):
    """Text prompts need the checkpoint's own vocabulary; --prompt-ids run without one."""
    _, _, path = write_tiny(tmp_path)
    run = [sys.executable, "-m", "salactl", "run", "--model", str(path), "-n", "2", "--json"]
    r = subprocess.run(run + ["--prompt", "hi"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 5 and f"checkpoint {path} has no tokenizer.json" in r.stderr, r.stderr
    r = subprocess.run(run + ["--prompt-ids", "1,2,3"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and len(json.loads(r.stdout)["output_token_ids"]) == 2, r.stderr


def test_missing_tensor_is_named(tmp_path):
    _, _, path = write_tiny(tmp_path)
    _edit_single(path, lambda t: t.pop("model.layers.3.self_attn.z_proj.weight"))
    with pytest.raises(CheckpointError, match="lacks tensor model.layers.3.self_attn.z_proj.weight"):
        load_model(str(path), "cpu", "float32")


def test_extra_tensor_is_named(tmp_path):
    _, _, path = write_tiny(tmp_path)
    _edit_single(path, lambda t: t.__setitem__("model.layers.1.self_attn.bogus", torch.zeros(2)))
    with pytest.raises(CheckpointError, match="unexpected tensor model.layers.1.self_attn.bogus"):
        load_model(str(path), "cpu", "float32")


def test_wrong_shape_is_named(tmp_path):
    _, _, path = write_tiny(tmp_path)
    _edit_single(path, lambda t: t.__setitem__("model.norm.weight", torch.ones(7)))
    with pytest.raises(CheckpointError, match=r"model.norm.weight has shape \[7\]"):
        load_model(str(path), "cpu", "float32")


def test_a_transposed_weight_is_named_as_a_wrong_shape(tmp_path):
    """A non-square weight stored transposed (same numbers of elements and dims) is refused by name."""
    _, state, path = write_tiny(tmp_path)
    name = "model.layers.0.mlp.down_proj.weight"
    rows, cols = state[name].shape
    assert rows != cols
    _edit_single(path, lambda t: t.__setitem__(name, t[name].t().contiguous()))
    with pytest.raises(CheckpointError, match=rf"{name} has shape \[{cols}, {rows}\]"):
        load_model(str(path), "cpu", "float32")


def test_rope_buffers_in_checkpoint_are_ignored(tmp_path):
    _, _, path = write_tiny(tmp_path)
    _edit_single(path, lambda t: t.__setitem__("model.layers.1.self_attn.rotary_emb.inv_freq", torch.ones(4)))
    load_model(str(path), "cpu", "float32")


@pytest.mark.parametrize("name", ["model.layers.1.self_attn.mycos_cached", "model.layers.1.self_attn.xrotary_emb.inv_freq"])
def test_names_merely_ending_like_rope_buffers_are_refused(tmp_path, name):
    _, _, path = write_tiny(tmp_path)
    _edit_single(path, lambda t: t.__setitem__(name, torch.ones(4)))
    with pytest.raises(CheckpointError, match=f"unexpected tensor {name}"):
        load_model(str(path), "cpu", "float32")


def test_save_refuses_existing_dir_and_leaves_no_temp(tmp_path):
    from salactl.errors import OutputExistsError

    cfg, state, path = write_tiny(tmp_path)
    with pytest.raises(OutputExistsError):
        save_checkpoint(state, cfg.to_hf_dict(), path)
    assert [p.name for p in tmp_path.iterdir()] == ["ckpt"]


def test_overwrite_never_deletes_the_working_directory_or_a_non_checkpoint(tmp_path, monkeypatch):
    from salactl.errors import OutputExistsError, UsageError

    cfg, state, path = write_tiny(tmp_path)
    work = tmp_path / "work"
    (work / "sub").mkdir(parents=True)
    (work / "keep.txt").write_text("mine")
    monkeypatch.chdir(work / "sub")
    for target in (".", "..", str(work)):
        with pytest.raises(OutputExistsError, match="holds the working directory"):
            save_checkpoint(state, cfg.to_hf_dict(), Path(target), overwrite=True)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(OutputExistsError, match="no config.json"):
        save_checkpoint(state, cfg.to_hf_dict(), work, overwrite=True)
    assert (work / "keep.txt").read_text() == "mine" and (work / "sub").is_dir()
    with pytest.raises(UsageError, match="keep.txt, which is a file"):
        check_output_dir(work / "keep.txt" / "ckpt", overwrite=False)
    for overwrite in (False, True):                   # a file is a usage error, as for every --out
        with pytest.raises(UsageError, match="keep.txt is a file; give a directory"):
            check_output_dir(work / "keep.txt", overwrite=overwrite)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt", "work"]
    save_checkpoint(state, cfg.to_hf_dict(), path, overwrite=True)    # a checkpoint is replaced
    save_checkpoint(state, cfg.to_hf_dict(), work / "sub", overwrite=True)   # an empty dir too
    assert (work / "sub" / "config.json").is_file()


def test_saved_checkpoint_files_follow_the_umask(tmp_path):
    cfg, state, _ = write_tiny(tmp_path)
    old = os.umask(0o022)
    try:
        out = save_checkpoint(state, cfg.to_hf_dict(), tmp_path / "out")
    finally:
        os.umask(old)
    assert stat.S_IMODE(out.stat().st_mode) == 0o755
    assert {f.name: stat.S_IMODE(f.stat().st_mode) for f in out.iterdir()} == {
        "config.json": 0o644, "model.safetensors": 0o644}


def test_config_round_trip_and_aliases():
    d = sala_9b().to_hf_dict()
    d["mixer_types"] = ["lightning" if m == "lightning-attn" else m for m in d["mixer_types"]]
    d.pop("torch_dtype")
    d["dtype"] = "bfloat16"
    cfg = SalaConfig.from_hf_dict(json.loads(json.dumps(d)))
    assert cfg == sala_9b()
    assert cfg.sparse_layers == (0, 9, 16, 17, 22, 29, 30, 31)
    assert abs(cfg.residual_scale - 0.24748737) < 1e-8 and cfg.logit_divisor == 16
    assert cfg.sparse_config.selected_blocks == 96


@pytest.mark.parametrize("edit,msg", [
    (lambda d: d.update(mixer_types=d["mixer_types"][:-1]), "mixer_types has 31 entries"),
    (lambda d: d["mixer_types"].__setitem__(3, "mamba"), "mixer_types\\[3\\] = 'mamba' is unknown"),
    (lambda d: d.update(num_key_value_heads=3), "GQA group must be integral"),
    (lambda d: d["sparse_config"].update(block_size=40), "not a multiple of kernel_stride"),
    (lambda d: d.update(model_type="llama"), "not a MiniCPM-SALA checkpoint"),
    (lambda d: d.pop("hidden_size"), "lacks required keys"),
    (lambda d: d["sparse_config"].update(topk_typo=3), "unknown keys"),
    (lambda d: d.update(lightning_nkv=16), "no GQA"),
    (lambda d: (d.pop("head_dim"), d.update(num_attention_heads=24)), "no head_dim"),
    (lambda d: d.update(mixer_types=["lightning-attn"] + d["mixer_types"][1:]), "mixer_types\\[0\\] must be"),
])
def test_bad_config_one_line_errors(edit, msg):
    d = sala_9b().to_hf_dict()
    edit(d)
    with pytest.raises(ConfigError, match=msg):
        SalaConfig.from_hf_dict(d)


def test_unknown_preset():
    with pytest.raises(ConfigError, match="valid presets: sala-9b, sala-nano"):
        preset("sala-7b")


def test_plain_checkpoint_carries_fp8_kv_scales(tmp_path):
    from salactl.runtime.kv_fp8 import model_kv_scales

    cfg = tiny_config()
    state = random_state_dict(cfg, "cpu", torch.float32, 0)
    layer = cfg.sparse_layers[-1]
    state[f"model.layers.{layer}.self_attn.k_scale"] = torch.tensor([0.02, 0.03])
    state[f"model.layers.{layer}.self_attn.v_scale"] = torch.tensor(0.05)
    path = save_checkpoint(state, cfg.to_hf_dict(), tmp_path / "ckpt")
    assert oct(path.stat().st_mode & 0o777) == "0o755"
    scales = model_kv_scales(load_model(str(path), "cpu", "float32").model)
    assert set(scales) == {layer} and torch.equal(scales[layer][0], torch.tensor([0.02, 0.03]))

    state[f"model.layers.{cfg.lightning_layers[0]}.self_attn.k_scale"] = torch.tensor(0.1)
    bad = save_checkpoint(state, cfg.to_hf_dict(), tmp_path / "bad")
    with pytest.raises(CheckpointError, match="not under a minicpm4"):
        load_model(str(bad), "cpu", "float32")


def test_one_seed_gives_one_model_in_every_dtype():
    """Random weights are the fp32 draw rounded to the dtype: torch's normal_ draws another stream
    for 16-bit tensors in some versions and sizes (2.11 on CPU; 2.13 past 16 elements but not a
    multiple of 16), so a --random-weights model in bf16 would otherwise be unrelated to the same
    seed in fp32."""
    from salactl.runtime.config import LIGHTNING, SPARSE, SparseConfig

    cfg = SalaConfig(vocab_size=9, hidden_size=4, intermediate_size=4, num_hidden_layers=2,
                     num_attention_heads=2, num_key_value_heads=1, head_dim=2,
                     mixer_types=(SPARSE, LIGHTNING), lightning_nh=2, lightning_nkv=2,
                     lightning_head_dim=2, dim_model_base=4, eos_token_id=(2,), initializer_range=0.1,
                     sparse_config=SparseConfig(block_size=16, dense_len=40, init_blocks=1, kernel_size=8,
                                                kernel_stride=4, topk=1, window_size=16))
    for config in (cfg, tiny_config()):
        exact = random_state_dict(config, "cpu", torch.float32, 7)
        assert config is not cfg or exact["model.embed_tokens.weight"].numel() == 36  # > 16, not 16k
        for dtype in (torch.bfloat16, torch.float16):
            got = random_state_dict(config, "cpu", dtype, 7)
            assert set(got) == set(exact)
            for name, t in got.items():
                assert t.dtype == dtype and torch.equal(t, exact[name].to(dtype)), (name, dtype)

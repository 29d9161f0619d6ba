"""Valid checkpoint variants other tools write: transformers-5 `rope_parameters`, AutoGPTQ's
standalone quantize_config.json, a quantized lm_head next to unquantized layers. Each loads with
the semantics it states, or is refused with one line; none is silently misread."""

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from salactl.errors import CheckpointError, ConfigError
from salactl.quant.packing import to_gptq_tensors
from salactl.quant.quantizer import QuantSpec
from salactl.quant.rtn import rtn_quantize
from salactl.runtime.engine import Engine
from salactl.runtime.loader import EMBEDDED_DIR, load_model
from conftest import run_cli

IDS = list(range(1, 300, 7))
INDEX = "model.safetensors.index.json"


def edit_config(path: Path, change) -> Path:
    d = json.loads((path / "config.json").read_text())
    change(d)
    (path / "config.json").write_text(json.dumps(d))
    return path


def logits(path, chunk_size: int = 512, dtype: str = "float32") -> torch.Tensor:
    lm = load_model(str(path), "cpu", dtype)
    engine = Engine(lm.model, "cpu", chunk_size=chunk_size)
    return engine.prefill(engine.new_sequence(), IDS, all_logits=True)


@pytest.fixture
def nano(tmp_path):
    return Path(shutil.copytree(EMBEDDED_DIR, tmp_path / "nano"))


def test_rope_parameters_theta_is_used_like_top_level_rope_theta(nano, tmp_path):
    top = edit_config(Path(shutil.copytree(nano, tmp_path / "top")), lambda d: d.update(rope_theta=1e6))
    nested = edit_config(nano, lambda d: (d.pop("rope_theta"),
                                          d.update(rope_parameters={"rope_type": "default", "rope_theta": 1e6})))
    base = logits(EMBEDDED_DIR)
    assert not torch.equal(logits(top), base)          # the base matters for this model
    torch.testing.assert_close(logits(nested), logits(top), rtol=0, atol=0)


@pytest.mark.parametrize("key,value,msg", [
    ("rope_parameters", {"rope_type": "yarn", "factor": 4.0, "rope_theta": 10000.0}, "'yarn' RoPE scaling"),
    ("rope_parameters", {"rope_type": "default", "rope_theta": 5e5}, "disagree"),
    ("rope_parameters", {"rope_type": "default", "partial_rotary_factor": 0.5}, "partial_rotary_factor"),
    ("rope_parameters", {"rope_theta": "big"}, "expected a number"),
    ("rope_scaling", {"type": "linear", "factor": 2.0}, "'linear' RoPE scaling"),
    ("rope_scaling", "linear", "must be an object"),
])
def test_rope_scaling_is_refused_never_ignored(nano, key, value, msg, capsys):
    edit_config(nano, lambda d: d.update({key: value}))
    with pytest.raises(ConfigError, match=msg):
        load_model(str(nano), "cpu", "float32")
    code, _, err = run_cli(["run", "--model", nano, "--prompt", "hi", "-n", 1, "--device", "cpu"], capsys)
    assert code == 3 and len(err.strip().splitlines()) == 1, err


def test_default_rope_scaling_object_means_no_scaling(nano):
    edit_config(nano, lambda d: d.update(rope_scaling={"rope_type": "default"}))
    torch.testing.assert_close(logits(nano), logits(EMBEDDED_DIR), rtol=0, atol=0)


def test_standalone_quantize_config_json_loads_like_the_embedded_one(nano_rtn_dir, tmp_path):
    moved = Path(shutil.copytree(nano_rtn_dir, tmp_path / "standalone"))
    cfg = json.loads((moved / "config.json").read_text())
    qc = cfg.pop("quantization_config")
    qc.pop("quant_method")                            # AutoGPTQ's file has no quant_method
    (moved / "config.json").write_text(json.dumps(cfg))
    (moved / "quantize_config.json").write_text(json.dumps(qc))
    torch.testing.assert_close(logits(moved), logits(nano_rtn_dir), rtol=0, atol=0)


def test_gptq_tensors_without_any_quantization_config_say_so(nano_rtn_dir, tmp_path):
    bare = edit_config(Path(shutil.copytree(nano_rtn_dir, tmp_path / "bare")), lambda d: d.pop("quantization_config"))
    with pytest.raises(CheckpointError, match=r"has GPTQ tensors \(\.qweight\) but neither config.json nor "
                                              r"quantize_config.json"):
        load_model(str(bare), "cpu", "float32")


def quantize_lm_head_only(src: Path, dst: Path) -> Path:
    """A GPTQ checkpoint whose only quantized module is lm_head (quantization.md allows lm_head: true)."""
    dst = Path(shutil.copytree(src, dst))
    index = json.loads((dst / INDEX).read_text())
    shard = dst / index["weight_map"]["lm_head.weight"]
    with safe_open(shard, framework="pt") as f:
        tensors = {n: f.get_tensor(n) for n in f.keys()}
    q = rtn_quantize(tensors.pop("lm_head.weight"), QuantSpec(4, 128))
    for suffix, t in to_gptq_tensors(q.codes, q.scales, q.g_idx, 4).items():
        tensors[f"lm_head.{suffix}"] = t
    save_file(tensors, str(shard), metadata={"format": "pt"})
    index["weight_map"] = {n: m for n, m in index["weight_map"].items() if n != "lm_head.weight"}
    index["weight_map"].update({f"lm_head.{s}": shard.name for s in ("qweight", "qzeros", "scales", "g_idx")})
    (dst / INDEX).write_text(json.dumps(index))
    return edit_config(dst, lambda d: d.update(quantization_config={
        "quant_method": "gptq", "bits": 4, "group_size": 128, "desc_act": False, "sym": True,
        "checkpoint_format": "gptq", "lm_head": True}))


def cached_keys(path, dtype: str):
    lm = load_model(str(path), "cpu", dtype)
    engine = Engine(lm.model, "cpu")
    seq = engine.new_sequence()
    engine.prefill(seq, IDS)
    return lm, seq, {i: k[: seq.length] for i, k in seq._k.items()}


@pytest.mark.parametrize("dtype,torch_dtype", [("float32", torch.float32), ("float16", torch.float16)])
def test_quantized_lm_head_keeps_the_model_dtype_for_the_kv_cache(nano, tmp_path, dtype, torch_dtype):
    lm, seq, keys = cached_keys(quantize_lm_head_only(nano, tmp_path / "lm_head_q"), dtype)
    assert not hasattr(lm.model.lm_head, "weight")     # really the quantized module
    assert seq.kv_dtype == torch_dtype
    # lm_head does not feed the layers: their cached keys are those of the unquantized model.
    _, _, dense_keys = cached_keys(EMBEDDED_DIR, dtype)
    for i in dense_keys:
        torch.testing.assert_close(keys[i], dense_keys[i], rtol=0, atol=0)


def test_preflights_see_a_standalone_quantize_config_as_loading_does(nano_rtn_dir, tmp_path):
    """profile's memory check counts the checkpoint's W4A16 weights, not full-precision ones."""
    from salactl.profiling.preflight import step_memory_bytes
    from salactl.profiling.spec import ProfileSpec
    from salactl.runtime.loader import model_config, model_quantization

    moved = Path(shutil.copytree(nano_rtn_dir, tmp_path / "standalone"))
    cfg = json.loads((moved / "config.json").read_text())
    qc = cfg.pop("quantization_config")
    (moved / "config.json").write_text(json.dumps(cfg))
    (moved / "quantize_config.json").write_text(json.dumps(qc))
    assert model_quantization(str(moved))["bits"] == 4 and model_quantization("sala-nano") is None
    spec = ProfileSpec(model=str(moved), weights="w4a16")
    quantized = step_memory_bytes(spec, model_config(str(moved)), 4, model_quantization(str(moved)) is not None)
    full = step_memory_bytes(spec, model_config(str(moved)), 4, False)
    assert quantized[1] < full[1] / 2

"""What SGLang and vLLM read from a `salactl quantize` checkpoint, checked against our own
re-statements of the engines' rules (written here from their documented behaviour, not imported):
the `--quantization-param-path` KV-scale file, the `dynamic` "-:" rules for modules left unquantized
(on the report's custom shapes, where q/k/v and down_proj break Marlin's rules), and GPTQ scales
outside float16's range."""

import json
import re
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from conftest import run_cli
from salactl.runtime.config import SPARSE
from salactl.runtime.presets import sala_nano

# -- SGLang's QuantParamSchema / KVCacheQuantSchema (model_loader/weight_utils.py), restated ----------
# - `model_type: Optional[str]` has no default, so pydantic v2 requires the key; when the loader's
#   context has a model_type (config.__class__.model_type) the value must equal it;
# - kv_cache.dtype must be "float8_e4m3fn" (check_is_fp8);
# - scaling_factor: Dict[int, Dict[int, float]] (JSON string keys coerced to int), exactly tp_size ranks
#   (check_tp_ranks), each with exactly num_hidden_layers entries, and the current rank holding every
#   layer index 0..L-1 (check_current_rank). Extra top-level keys are ignored.
# Any failure is caught by kv_cache_scales_loader, which then silently uses 1.0 for every layer.


def sglang_schema_errors(data, model_type, num_hidden_layers, tp_rank=0, tp_size=1) -> list[str]:
    errors = []
    if not isinstance(data, dict):
        return ["not an object"]
    if "model_type" not in data:
        errors.append("model_type: field required")
    elif data["model_type"] is not None and not isinstance(data["model_type"], str):
        errors.append("model_type: not a string")
    elif model_type is not None and data["model_type"] != model_type:
        errors.append(f"model_type {data['model_type']!r} != {model_type!r}")
    kv = data.get("kv_cache")
    if not isinstance(kv, dict) or not isinstance(kv.get("dtype"), str) or not isinstance(kv.get("scaling_factor"), dict):
        return errors + ["kv_cache: needs dtype (str) and scaling_factor (object)"]
    if kv["dtype"] != "float8_e4m3fn":
        errors.append(f"dtype {kv['dtype']} is not float8_e4m3fn")
    try:
        sf = {int(r): {int(i): float(v) for i, v in layers.items()} for r, layers in kv["scaling_factor"].items()}
    except (TypeError, ValueError, AttributeError) as e:
        return errors + [f"scaling_factor: not Dict[int, Dict[int, float]] ({e})"]
    if len(sf) != tp_size:
        errors.append(f"{len(sf)} TP ranks, expected {tp_size}")
    for r, layers in sf.items():
        if len(layers) != num_hidden_layers:
            errors.append(f"rank {r}: expected {num_hidden_layers} layers, got {len(layers)}")
    missing = [i for i in range(num_hidden_layers) if i not in sf.get(tp_rank, {})]
    if missing:
        errors.append(f"rank {tp_rank} lacks layer {missing[0]}")
    return errors


def test_the_schema_restatement_rejects_the_old_file_shape():
    old = {"kv_cache": {"dtype": "float8_e4m3fn", "scaling_factor": {"0": {"0": 0.01, "7": 0.02}}}}
    errs = sglang_schema_errors(old, "minicpm_sala", 8)
    assert any("model_type" in e for e in errs) and any("expected 8 layers" in e for e in errs)
    e5m2 = {"model_type": "minicpm_sala", "kv_cache": {"dtype": "float8_e5m2",
                                                       "scaling_factor": {"0": {str(i): 1.0 for i in range(8)}}}}
    assert sglang_schema_errors(e5m2, "minicpm_sala", 8) == ["dtype float8_e5m2 is not float8_e4m3fn"]


# -- the engines' choice of quantized vs. plain linears, restated ---------------------------------------
# Both build merged layers (packed_modules_mapping) and pass the engine's own layer prefix:
# - SGLang (quantization/utils.py get_linear_quant_method / get_dynamic_override): a layer is plain iff
#   some "-:REGEX" key of `dynamic` has re.match(REGEX, prefix); otherwise it gets GPTQ params.
# - vLLM (gptq_utils.get_linear_quant_method): plain iff a "-:" rule matches, or the layer is not in
#   modules_in_block_to_quantize, which maybe_update_config derives from the safetensors dtypes (the
#   prefixes of non-float tensors); a merged layer is quantized iff its shards are (substring match).
ENGINE_MERGED = {"self_attn.qkv_proj": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
                 "mlp.gate_up_proj": ("mlp.gate_proj", "mlp.up_proj")}


def engine_layers(config, i: int) -> dict[str, tuple[str, ...]]:
    """Engine linear prefix of layer i -> the checkpoint modules it loads."""
    p = f"model.layers.{i}."
    own = ["self_attn.o_proj", "mlp.down_proj",
           "self_attn.o_gate" if config.mixer_types[i] == SPARSE else "self_attn.z_proj"]
    out = {p + m: (p + m,) for m in own}
    out.update({p + m: tuple(p + s for s in shards) for m, shards in ENGINE_MERGED.items()})
    return out


def dynamic_skips(qc: dict, prefix: str) -> bool:
    return any(re.match(rule[2:], prefix) for rule in qc.get("dynamic", {}) if rule.startswith("-:"))


def sglang_quantized(qc: dict, prefix: str) -> bool:
    return not dynamic_skips(qc, prefix)


def vllm_quantized(qc: dict, prefix: str, shards: tuple[str, ...], dtypes: dict[str, torch.dtype]) -> bool:
    quant_layers = {n.rsplit(".", 1)[0] for n, d in dtypes.items() if not d.is_floating_point}
    per_shard = {any(q in s for q in quant_layers) for s in shards}
    assert len(per_shard) == 1, f"vLLM refuses {prefix}: its shards disagree"
    return not dynamic_skips(qc, prefix) and per_shard.pop()


def _dtypes(path: Path) -> dict[str, torch.dtype]:
    out = {}
    for f in sorted(path.glob("*.safetensors")):
        with safe_open(f, framework="pt") as h:
            out.update({k: h.get_tensor(k).dtype for k in h.keys()})
    return out


def custom_config():
    """The QA report's custom shapes: one KV head (k/v 32 wide: N % 64 breaks Marlin, so q/k/v of the
    softmax layers stay plain) and intermediate 832 (down_proj's K % 128 breaks it)."""
    return sala_nano().replace(intermediate_size=832, num_key_value_heads=1)


def _quantize(tmp: Path, kv: str, capsys) -> tuple[Path, str]:
    src = tmp / "custom"
    src.mkdir(exist_ok=True)
    (src / "config.json").write_text(json.dumps(custom_config().to_hf_dict()))
    out = tmp / f"q_{kv}"
    code, _, err = run_cli(["quantize", "--model", src, "--random-weights", "--method", "rtn", "--calib", "random",
                            "--nsamples", 2, "--seqlen", 64, "--kv-cache-dtype", kv, "--device", "cpu",
                            "--out", out], capsys)
    assert code == 0, err
    return out, err


def test_sglang_kv_scale_file_validates_and_dynamic_rules_match_both_engines(tmp_path, capsys):
    out, err = _quantize(tmp_path, "fp8_e4m3", capsys)
    config = custom_config()
    cfg = json.loads((out / "config.json").read_text())
    qc = cfg["quantization_config"]

    # 1. the KV-scale file passes SGLang's schema, with the checkpoint's own scales where there is a KV cache
    data = json.loads((out / "kv_cache_scales.json").read_text())
    assert sglang_schema_errors(data, cfg["model_type"], cfg["num_hidden_layers"]) == []
    dtypes = _dtypes(out)
    factors = {int(i): v for i, v in data["kv_cache"]["scaling_factor"]["0"].items()}
    with safe_open(next(out.glob("*.safetensors")), framework="pt") as h:
        for i in range(config.num_hidden_layers):
            if i in config.sparse_layers:
                k, v = (h.get_tensor(f"model.layers.{i}.self_attn.{s}_scale") for s in "kv")
                assert factors[i] == pytest.approx(float(torch.maximum(k.max(), v.max())))
                assert 0 < factors[i] < 1          # calibrated, not the 1.0 default
            else:
                assert factors[i] == 1.0 and f"model.layers.{i}.self_attn.k_scale" not in dtypes
    assert qc["meta"]["kv_cache_scales_file"] == "kv_cache_scales.json"

    # 2. every engine layer is quantized in SGLang and vLLM exactly when the checkpoint quantized it
    skipped_any = {"self_attn.qkv_proj": False, "mlp.down_proj": False}
    for i in range(config.num_hidden_layers):
        for prefix, shards in engine_layers(config, i).items():
            truth = {s + ".qweight" in dtypes for s in shards}
            assert len(truth) == 1, f"{prefix}: shards quantized differently"
            truth = truth.pop()
            assert truth == all(s + ".weight" not in dtypes for s in shards)
            assert sglang_quantized(qc, prefix) == truth, f"SGLang builds {prefix} wrongly"
            assert vllm_quantized(qc, prefix, shards, dtypes) == truth, f"vLLM builds {prefix} wrongly"
            for m in skipped_any:
                skipped_any[m] |= prefix.endswith(m) and not truth
    assert all(skipped_any.values())           # the shapes did leave a merged and an unmerged layer plain
    assert "model.layers.0.self_attn.q_proj" in qc["meta"]["unquantized_modules"]


def test_fp8_e5m2_writes_no_sglang_file_and_says_why(tmp_path, capsys):
    out, err = _quantize(tmp_path, "fp8_e5m2", capsys)
    assert not (out / "kv_cache_scales.json").exists()
    warnings = [line for line in err.splitlines() if "kv_cache_scales.json" in line]
    assert len(warnings) == 1 and warnings[0].startswith("warning: ") and "fp8_e4m3" in warnings[0], err
    meta = json.loads((out / "config.json").read_text())["quantization_config"]["meta"]
    assert meta["kv_cache_dtype"] == "fp8_e5m2" and "kv_cache_scales_file" not in meta


# -- GPTQ scales are checked in float16, the dtype every runtime layout computes from ------------------

@pytest.fixture(scope="module")
def rtn_ckpt(tmp_path_factory):
    from salactl.quant.sequential import QuantOptions, quantize_model
    from salactl.quant.writer import quantization_config, write_quantized_checkpoint
    from salactl.runtime.checkpoint import random_state_dict
    from salactl.runtime.loader import build_model

    config = sala_nano(vocab_size=512)
    model = build_model(config, random_state_dict(config, "cpu", torch.float32, 0))
    opts = QuantOptions(method="rtn")
    res = quantize_model(model, config, None, opts)
    qc = quantization_config(opts, res.skipped)
    return write_quantized_checkpoint(tmp_path_factory.mktemp("q") / "rtn", config, model, res.quantized, qc, None)


def _with_scales(src: Path, dst: Path, dtype: torch.dtype, value: float) -> Path:
    import shutil

    shutil.copytree(src, dst)
    t = {}
    for f in sorted(dst.glob("*.safetensors")):
        with safe_open(f, framework="pt") as h:
            t.update({k: h.get_tensor(k) for k in h.keys()})
        f.unlink()
    (dst / "model.safetensors.index.json").unlink(missing_ok=True)
    for n in [n for n in t if n.endswith(".scales")]:
        t[n] = t[n].to(dtype)                                  # a bf16/fp32-scales tool's checkpoint
    t["model.layers.0.self_attn.q_proj.scales"][0, 0] = value
    save_file(t, str(dst / "model.safetensors"), metadata={"format": "pt"})
    return dst


@pytest.mark.parametrize("dtype,value,match", [
    (torch.bfloat16, 7.0e4, "outside float16's range"),
    (torch.float32, 1.0e6, "outside float16's range"),
    (torch.float32, float("inf"), "NaN/Inf"),
    (torch.bfloat16, float("nan"), "NaN/Inf"),
])
def test_scales_beyond_float16_are_a_one_line_checkpoint_error(rtn_ckpt, tmp_path, dtype, value, match, capsys):
    bad = _with_scales(rtn_ckpt, tmp_path / "bad", dtype, value)
    code, _, err = run_cli(["run", "--model", bad, "--prompt-ids", "1,2", "-n", 1, "--device", "cpu"], capsys)
    assert code == 4, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and match in lines[0], err
    assert "model.layers.0.self_attn.q_proj.scales" in lines[0]


def test_in_range_bf16_and_fp32_scales_still_load(rtn_ckpt, tmp_path):
    from salactl.runtime.loader import load_model

    for dtype in (torch.bfloat16, torch.float32):
        ok = _with_scales(rtn_ckpt, tmp_path / str(dtype), dtype, 6.0e4)     # below fp16's 65504
        q = load_model(str(ok), "cpu", "float32").model.model.layers[0].self_attn.q_proj
        assert bool(torch.isfinite(q.dequantized_weight()).all())

"""Load symmetric GPTQ checkpoints (ours, and other tools' v1 `gptq` / v2 `gptq_v2` of this
architecture) into the runtime: quantized linears become `GPTQLinear` (an all-zero .bias beside one,
as GPTQ-for-LLaMa writes them, is dropped), everything else loads strictly like a plain checkpoint;
calibrated FP8 KV scales (`self_attn.k_scale/v_scale`, or other tools' names for them) are kept.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import torch

from salactl.errors import CheckpointError
from salactl.quant.linear import GPTQLinear, gptq_scales_fp16
from salactl.quant.packing import FORMATS, num_groups, symmetric_qzeros_word
from salactl.runtime.checkpoint import expected_tensor_shapes, load_state_dict, open_safetensors, tensor_files
from salactl.runtime.config import SalaConfig
from salactl.runtime.layers.model import SalaForCausalLM
from salactl.runtime.loader import meta_model

QUANT_SUFFIXES = (".qweight", ".qzeros", ".scales", ".g_idx")
# the tensors attach_kv_scales reads (load_state_dict lets them through)
KV_SCALE_SUFFIXES = (".k_scale", ".v_scale", ".kv_scale")
# a sparse layer's name under self_attn -> the scales it sets: ours, ModelOpt's and vLLM's per-projection
# names, and the legacy single kv_scale, which is both k's and v's
_KV_SCALE_NAMES = {"k_scale": ("k_scale",), "v_scale": ("v_scale",), "k_proj.k_scale": ("k_scale",),
                   "v_proj.v_scale": ("v_scale",), "kv_scale": ("k_scale", "v_scale")}
_KV_SCALE_NAME = re.compile(r"model\.layers\.(0|[1-9]\d*)\.self_attn\.(.+)")
_FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def parse_quant_config(qc: dict) -> dict:
    """Validate `quantization_config`; returns {bits, group_size, fmt, desc_act}. What `dynamic` rules
    override is checked against the model's layers by check_dynamic_overrides."""
    if not isinstance(qc, dict):
        raise CheckpointError("quantization_config (config.json or quantize_config.json) must be a JSON object")
    _check_quant_method(qc.get("quant_method"))
    if "bits" not in qc:
        raise CheckpointError(f"quantization_config has no bits; expected {_EXPECTED['bits']}")
    for key, value in qc.items():
        _check_type("quantization_config.", key, value)
    bits, group = qc["bits"], qc.get("group_size", -1)
    if bits not in (4, 8):
        raise CheckpointError(f"quantization_config.bits = {bits}; salactl loads only 4- and 8-bit GPTQ")
    if not (group == -1 or group > 0):
        raise CheckpointError(f"quantization_config.group_size = {group}; expected {_EXPECTED['group_size']}")
    if qc.get("sym", True) is not True:
        raise CheckpointError("asymmetric GPTQ (sym=false) is not supported; quantize with sym=true "
                              "(the only form Marlin runs)")
    _check_pack_dtype(qc.get("pack_dtype"))
    fmt = qc.get("checkpoint_format") or qc.get("format") or "gptq"
    if fmt not in FORMATS:
        # vLLM and SGLang compare it as written (unlike quant_method): "GPTQ_V2" would be v1 to vLLM
        case = " (case matters: vLLM and SGLang compare it as written)" if str(fmt).lower() in FORMATS else ""
        raise CheckpointError(f"checkpoint_format {fmt!r} is not supported; valid: {', '.join(FORMATS)}{case}")
    dynamic_rules(qc)
    return {"bits": bits, "group_size": group, "fmt": fmt, "desc_act": qc.get("desc_act") is True}


# the JSON type each key salactl reads must have, and how to say it
_BOOL = "true or false"
_EXPECTED = {"bits": "the integer 4 or 8",
             "group_size": "an integer: a positive group size such as 128, or -1 for one group per row",
             "sym": _BOOL, "desc_act": _BOOL}


def _check_type(where: str, key: str, value) -> None:
    """Refuse a value of `key` that is not the JSON type salactl reads it as. Python's truthiness and
    int/bool equality (True == 1, 4.0 == 4) would let "false", 1 or 4.0 through, while vLLM and
    transformers use the value as written: to them "desc_act": "false" is true."""
    if key not in _EXPECTED or (key == "desc_act" and value is None):    # null: vLLM reads it as false
        return
    ok = isinstance(value, bool) if _EXPECTED[key] == _BOOL else (isinstance(value, int)
                                                                 and not isinstance(value, bool))
    if not ok:
        quoted = " (a JSON string; write it without quotes)" if isinstance(value, str) else ""
        raise CheckpointError(f"{where}{key} = {json.dumps(value, default=repr)}; expected {_EXPECTED[key]}{quoted}")


def _check_quant_method(method) -> None:
    """Any case, as vLLM and SGLang lowercase quant_method before dispatching on it."""
    if not isinstance(method, str):
        raise CheckpointError(f"quantization_config.quant_method is {json.dumps(method, default=repr)}; "
                              "expected a string such as \"gptq\"")
    if method.lower() not in ("gptq", "gptq_marlin"):
        raise CheckpointError(f"quant_method {method!r} is not supported; salactl loads only GPTQ checkpoints "
                              "(quant_method \"gptq\")")


def _check_pack_dtype(pack_dtype) -> None:
    """GPTQModel's pack_dtype (int8/int16/int32/int64) is the word qweight and qzeros are packed in;
    vLLM, SGLang and salactl read int32 words only."""
    if pack_dtype is not None and pack_dtype != "int32":
        raise CheckpointError(f"quantization_config.pack_dtype {json.dumps(pack_dtype, default=repr)} is not "
                              "supported; salactl (as vLLM and SGLang) loads GPTQ packed in int32 words: re-quantize "
                              "with pack_dtype int32 (GPTQModel's default)")


def dynamic_rules(qc: dict) -> list[tuple[str, re.Pattern, dict | None]]:
    """GPTQModel's `dynamic`, in order: (rule, its regex, its overrides; None for a "-:" rule)."""
    dynamic = qc.get("dynamic")
    if dynamic is None:                 # GPTQModel writes null for no rules
        return []
    if not isinstance(dynamic, dict):
        raise CheckpointError(f"quantization_config.dynamic is a {type(dynamic).__name__}; expected an object "
                              "mapping module regexes to override objects (or remove it)")
    rules = []
    for rule, override in dynamic.items():
        rule = str(rule)
        skip = rule.startswith("-:")
        if not skip and not isinstance(override, dict):
            raise CheckpointError(f"quantization_config.dynamic rule {rule!r} maps to "
                                  f"{json.dumps(override, default=repr)}; expected an object of overrides such as "
                                  "{\"bits\": 4}")
        for key, value in ({} if skip else override).items():
            _check_type(f"quantization_config.dynamic rule {rule!r} sets ", key, value)
        try:
            pattern = re.compile(rule[2:] if rule.startswith(("-:", "+:")) else rule)
        except re.error as e:
            raise CheckpointError(f"quantization_config.dynamic rule {rule!r} is not a valid regular expression "
                                  f"({e})") from None
        rules.append((rule, pattern, None if skip else override))
    return rules


def engine_layer(module: str) -> str:
    """The layer prefix vLLM and SGLang build for a checkpoint module, which their `dynamic` rules
    match: the fused self_attn.qkv_proj / mlp.gate_up_proj for q/k/v and gate/up, else its own."""
    from salactl.quant.writer import ENGINE_MERGED

    head, _, tail = module.rpartition(".")
    parent, _, block = head.rpartition(".")
    for parts, merged in ENGINE_MERGED.items():
        if f"{block}.{tail}" in parts:
            return f"{parent}.{merged}"
    return module


def check_dynamic_overrides(qc: dict, spec: dict, quantized) -> None:
    """Refuse a `dynamic` rule that gives a quantized module other bits/group_size/sym than the
    checkpoint's (mixed precision). As the engines' get_dynamic_override: the first rule whose regex
    re.match-es the module's engine layer decides; a "-:" rule overrides nothing (which modules are
    quantized is decided by the tensors present)."""
    rules = dynamic_rules(qc)
    if not any(override for _, _, override in rules):
        return
    own = {"bits": spec["bits"], "group_size": spec["group_size"], "sym": True}
    for module in quantized:
        layer = engine_layer(module)
        rule, _, override = next((r for r in rules if r[1].match(layer)), (None, None, None))
        changes = [f"{k} from {json.dumps(v)} to {json.dumps(override[k], default=repr)}" for k, v in own.items()
                   if override and override.get(k, v) != v]
        if changes:
            fused = f" (the fused layer vLLM and SGLang build from {module})" if layer != module else ""
            raise CheckpointError(f"quantization_config.dynamic rule {rule!r} changes {', '.join(changes)} for "
                                  f"{layer}{fused}; mixed-precision GPTQ checkpoints are not supported")


def _read(files: dict[str, Path], name: str) -> torch.Tensor:
    with open_safetensors(files[name]) as f:
        return f.get_tensor(name)


def _check(name: str, t: torch.Tensor, shape: tuple, dtypes: tuple) -> None:
    if tuple(t.shape) != tuple(shape):
        raise CheckpointError(f"tensor {name} has shape {list(t.shape)} but config.json and "
                              f"quantization_config imply {list(shape)}")
    if t.dtype not in dtypes:
        raise CheckpointError(f"tensor {name} has dtype {t.dtype}; expected "
                              + " or ".join(str(d).replace("torch.", "") for d in dtypes))


def _load_quantized(files, prefix: str, n: int, k: int, spec: dict) -> dict[str, torch.Tensor]:
    bits, group, fmt = spec["bits"], spec["group_size"], spec["fmt"]
    per_word = 32 // bits
    _check_packable(prefix, n, k, bits, group)
    groups = num_groups(k, group)
    out = {}
    for suffix, shape, dtypes in ((".qweight", (k // per_word, n), (torch.int32,)),
                                  (".qzeros", (groups, n // per_word), (torch.int32,)),
                                  (".scales", (groups, n), _FLOAT_DTYPES)):
        name = prefix + suffix
        if name not in files:
            raise CheckpointError(f"checkpoint lacks tensor {name} (GPTQ needs qweight, qzeros, scales)")
        out[suffix[1:]] = _read(files, name)
        _check(name, out[suffix[1:]], shape, dtypes)
    if prefix + ".g_idx" in files:
        gi = _read(files, prefix + ".g_idx")
        _check(prefix + ".g_idx", gi, (k,), (torch.int32, torch.int64))
        if int(gi.min()) < 0 or int(gi.max()) >= groups:
            raise CheckpointError(f"{prefix}.g_idx has group ids outside [0, {groups})")
        out["g_idx"] = gi
    word = symmetric_qzeros_word(bits, fmt)
    if not bool((out["qzeros"] == word).all()):
        raise CheckpointError(f"{prefix}.qzeros are not the symmetric value {word & 0xFFFFFFFF:#010x} for "
                              f"{bits}-bit {fmt}; asymmetric (or mislabelled v1/v2) GPTQ is not supported")
    out["scales"] = gptq_scales_fp16(out["scales"], prefix)      # checked in the dtype actually used
    return out


def _check_packable(prefix: str, n: int, k: int, bits: int, group: int) -> None:
    """GPTQ packs 32 // bits codes per int32 word along in_features (qweight) and out_features
    (qzeros), and its groups tile in_features."""
    per_word = 32 // bits
    for dim, size in (("in_features", k), ("out_features", n)):
        if size % per_word:
            raise CheckpointError(f"{prefix} has {dim} {size}, not a multiple of {per_word} ({bits}-bit GPTQ "
                                  f"packs {per_word} codes per int32 word); config.json's shapes do not fit "
                                  f"{bits}-bit GPTQ")
    if group != -1 and k % group:
        raise CheckpointError(f"{prefix}: in_features {k} is not a multiple of quantization_config.group_size "
                              f"{group} ({k} % {group} = {k % group}); correct group_size if it is not the one "
                              "the checkpoint was quantized with, else re-quantize with one that divides every "
                              "in_features")


def _zero_biases(files, quantized: dict[str, tuple]) -> tuple[str, ...]:
    """The names of the .bias tensors of quantized linears, checked to be all zero: GPTQ-for-LLaMa's
    QuantLinear registers a zero bias for every linear, so many GPTQ checkpoints of bias-free models
    hold them (vLLM skips them). This architecture's linears have no bias: a nonzero one is refused."""
    biases = []
    for prefix, (n, _) in quantized.items():
        name = prefix + ".bias"
        if name not in files:
            continue
        t = _read(files, name)
        _check(name, t, (n,), _FLOAT_DTYPES)
        if bool(t.any()):           # NaN counts as nonzero
            raise CheckpointError(f"tensor {name} is a nonzero bias, but this architecture's linears have none "
                                  "(config.json); salactl loads GPTQ biases only when they are all zero")
        biases.append(name)
    return tuple(biases)


def _set_module(model: torch.nn.Module, prefix: str, module: torch.nn.Module) -> None:
    parent_name, _, attr = prefix.rpartition(".")
    setattr(model.get_submodule(parent_name) if parent_name else model, attr, module)


def load_gptq_model(path: Path, config: SalaConfig, quant_cfg: dict, device, dtype) -> SalaForCausalLM:
    path = Path(path)
    spec = parse_quant_config(quant_cfg)
    files = tensor_files(path)
    expected = expected_tensor_shapes(config)
    quantized = {n[: -len(".weight")]: s for n, s in expected.items()
                 if n.endswith(".weight") and len(s) == 2 and n[: -len(".weight")] + ".qweight" in files}
    if not quantized:
        _refuse_float_weights_under_gptq(config, quant_cfg)
    if "model.embed_tokens" in quantized:
        raise CheckpointError("model.embed_tokens is quantized; embeddings must stay unquantized")
    check_dynamic_overrides(quant_cfg, spec, quantized)
    plain = {n: s for n, s in expected.items() if n[: -len(".weight")] not in quantized}
    # the zero biases' whole names as allowed suffixes: checked here, never loaded
    state = load_state_dict(path, plain, device, dtype,
                            allow_extra=QUANT_SUFFIXES + KV_SCALE_SUFFIXES + _zero_biases(files, quantized))
    orphans = sorted(n for n in files if n.endswith(QUANT_SUFFIXES)
                     and n.rsplit(".", 1)[0] not in quantized)
    if orphans:
        raise CheckpointError(f"checkpoint has GPTQ tensor {orphans[0]} for a module this architecture "
                              "does not quantize (or lacks its .qweight)")
    model = meta_model(config)
    permuted = []                   # modules whose g_idx is not k // group_size (from_gptq gave them a perm)
    for prefix, (n, k) in quantized.items():
        t = _load_quantized(files, prefix, n, k, spec)
        module = GPTQLinear.from_gptq(t["qweight"], t["scales"], t.get("g_idx"), spec["bits"], spec["group_size"],
                                      device, dtype, prefix)
        if module.perm is not None:
            permuted.append(prefix)
        _set_module(model, prefix, module)
    if permuted and not spec["desc_act"]:
        _warn_g_idx_without_desc_act(path, permuted)
    model.load_state_dict(state, strict=False, assign=True)
    attach_kv_scales(model, config, files, device)
    left = [n for n, p in list(model.named_parameters()) + list(model.named_buffers()) if p.is_meta]
    if left:
        raise CheckpointError(f"checkpoint {path} left {left[0]} unset")
    return model.eval().requires_grad_(False)


def _warn_g_idx_without_desc_act(path: Path, permuted: list[str]) -> None:
    """salactl computes with every g_idx; vLLM's and SGLang's GPTQ kernels read g_idx only when
    desc_act is true (has_g_idx = desc_act), so such a checkpoint is another model there."""
    from salactl import output      # here: importing rich.console draws from Python's global random

    more = f" (and {len(permuted) - 1} more modules)" if len(permuted) > 1 else ""
    output.warn_once(f"{path}: {permuted[0]}.g_idx{more} is not k // group_size but quantization_config.desc_act "
                     "is false: salactl applies g_idx, while vLLM and SGLang read it only with desc_act true and "
                     "would serve other outputs; set \"desc_act\": true in its quantization_config")


def _refuse_float_weights_under_gptq(config: SalaConfig, quant_cfg: dict) -> None:
    """A GPTQ config over a checkpoint without any .qweight is float weights that would pass for the
    quantized model (HF and vLLM refuse it), unless `dynamic` "-:" rules leave modules unquantized."""
    if any(str(rule).startswith("-:") for rule in quant_cfg.get("dynamic") or {}):
        return
    said, fix = (("quantization_config", "quantization_config from config.json")
                 if "quantization_config" in dict(config.extra) else ("quantize_config.json", "quantize_config.json"))
    raise CheckpointError(f"{said} says GPTQ but the checkpoint has no .qweight tensors; remove {fix} or re-quantize")


def attach_kv_scales(model, config: SalaConfig, files, device) -> None:
    """Register each sparse layer's FP8 KV scales (fp32, a scalar or one per KV head) as its
    self_attn.k_scale / v_scale buffers, from our names or another tool's (_KV_SCALE_NAMES)."""
    hkv = config.num_key_value_heads
    for (layer, attr), name in kv_scale_sources(config, files).items():
        t = _read(files, name)
        if t.numel() not in (1, hkv) or t.dtype not in _FLOAT_DTYPES or not bool(((t > 0) & t.isfinite()).all()):
            raise CheckpointError(f"{name} must be a positive finite float scalar or one per KV head ({hkv})")
        model.model.layers[layer].self_attn.register_buffer(attr, t.to(device=device, dtype=torch.float32))
    for i in config.sparse_layers:
        attn = model.model.layers[i].self_attn
        if hasattr(attn, "k_scale") != hasattr(attn, "v_scale"):
            raise CheckpointError(f"layer {i} has only one of self_attn.k_scale / v_scale")


def kv_scale_sources(config: SalaConfig, files) -> dict[tuple[int, str], str]:
    """(sparse layer, "k_scale" or "v_scale") -> the checkpoint tensor that holds it."""
    sources: dict[tuple[int, str], str] = {}
    for name in sorted(n for n in files if n.endswith(KV_SCALE_SUFFIXES)):
        m = _KV_SCALE_NAME.fullmatch(name)
        if m is None or m[2] not in _KV_SCALE_NAMES:
            raise CheckpointError(f"KV scale {name} has a name salactl does not read; expected "
                                  "model.layers.N.self_attn.k_scale / v_scale (or self_attn.k_proj.k_scale / "
                                  "v_proj.v_scale, or one self_attn.kv_scale for both)")
        layer = int(m[1])
        if layer not in config.sparse_layers:
            what = (f"layer {layer} is {config.mixer_types[layer]}" if layer < config.num_hidden_layers
                    else f"the model has no layer {layer}")
            raise CheckpointError(f"KV scale {name} is not under a minicpm4 (softmax attention) layer: {what}; "
                                  f"the minicpm4 layers are {', '.join(map(str, config.sparse_layers)) or 'none'}")
        for attr in _KV_SCALE_NAMES[m[2]]:
            other = sources.setdefault((layer, attr), name)
            if other != name:
                raise CheckpointError(f"checkpoint has both {other} and {name} for layer {layer}'s self_attn."
                                      f"{attr}; keep one")
    return sources

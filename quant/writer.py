"""Write a GPTQ v1 checkpoint that vLLM/SGLang load as gptq_marlin (reference/quantization.md §2-3):
qweight/qzeros/scales/g_idx per quantized linear, everything else unquantized under its own name,
`quantization_config` in config.json, FP8 KV scales, tokenizer + generation config copied.
Sharded safetensors + index, written to a temp dir and renamed (runtime/checkpoint.save_checkpoint).
"""

from __future__ import annotations

import json
import re
import tempfile
from pathlib import Path

import torch

import salactl
from salactl import output
from salactl.quant.sequential import QuantOptions
from salactl.runtime.checkpoint import expected_tensor_shapes, save_checkpoint
from salactl.runtime.config import SalaConfig
from salactl.runtime.kv_fp8 import SGLANG_E5M2_WARNING, fp8_dtype

COPIED_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "tokenizer.model",
                "generation_config.json", "chat_template.jinja", "added_tokens.json", "vocab.json",
                "merges.txt")
KV_SCALES_JSON = "kv_cache_scales.json"
# HF modules -> the merged layer vLLM and SGLang build from them (their packed_modules_mapping)
ENGINE_MERGED = {("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"): "self_attn.qkv_proj",
                 ("mlp.gate_proj", "mlp.up_proj"): "mlp.gate_up_proj"}
_DTYPE_NAMES = {torch.bfloat16: "bfloat16", torch.float16: "float16", torch.float32: "float32"}


def quantization_config(opts: QuantOptions, skipped: dict[str, str]) -> dict:
    """desc_act stays false: act-order uses static groups, so g_idx is k // group (§1)."""
    qc = {
        "quant_method": "gptq",
        "bits": opts.bits,
        "group_size": opts.group_size,
        "desc_act": False,
        "sym": True,
        "checkpoint_format": "gptq",
        "format": "gptq",
        "lm_head": False,
        "static_groups": bool(opts.desc_act),
        "true_sequential": True,
        "damp_percent": opts.damp,
        "damp_auto_increment": 0.01,
        "meta": {
            "quantizer": [f"salactl:{salactl.__version__}"],
            "method": opts.method,
            "act_order": bool(opts.desc_act),
            "unquantized_modules": ["model.embed_tokens", "lm_head"] + sorted(skipped),
        },
    }
    if skipped:
        qc["dynamic"] = {f"-:^{re.escape(name)}$": {} for name in unquantized_engine_modules(skipped)}
    if fp8_dtype(opts.kv_cache_dtype) is not None:
        qc["meta"]["kv_cache_dtype"] = opts.kv_cache_dtype
        if opts.kv_cache_dtype == "fp8_e4m3":          # SGLang's param file holds only e4m3 scales
            qc["meta"]["kv_cache_scales_file"] = KV_SCALES_JSON
    return qc


def stored_dtype(config: SalaConfig) -> torch.dtype:
    """The dtype of the unquantized tensors written: the source checkpoint's torch_dtype, which is
    what SGLang/vLLM serve it in, not the dtype quantize computed in (`--dtype auto` is float32 on
    CPU, which would double the embeddings' and lm_head's bytes)."""
    return {v: k for k, v in _DTYPE_NAMES.items()}.get(config.torch_dtype, torch.bfloat16)


def unquantized_engine_modules(skipped) -> list[str]:
    """The skipped HF modules, plus the merged layer vLLM/SGLang build (`self_attn.qkv_proj`,
    `mlp.gate_up_proj`) wherever a whole merged group is skipped: SGLang matches the `dynamic` "-:"
    rules only against its own (merged) layer prefix, so unfused names alone leave it building GPTQ
    params for plain weights. vLLM matches them the same way and agrees (all shards unquantized)."""
    names = set(skipped)
    for name in skipped:
        m = re.fullmatch(r"(model\.layers\.\d+\.)(.+)", name)
        for parts, merged in ENGINE_MERGED.items():
            if m and m[2] in parts and all(m[1] + part in names for part in parts):
                names.add(m[1] + merged)
    return sorted(names)


def write_quantized_checkpoint(out_dir: Path, config: SalaConfig, model, quantized: dict[str, dict],
                               qconfig: dict, model_dir: Path | None,
                               kv_scales: dict | None = None, kv_json: dict | None = None,
                               overwrite: bool = False, max_shard_bytes: int = 4 << 30) -> Path:
    """`quantized`: module prefix -> {qweight, qzeros, scales, g_idx} (packing.to_gptq_tensors);
    `model` supplies every other tensor (quantized linears' in-memory weights are not written)."""
    params = dict(model.named_parameters())
    dtype = stored_dtype(config)
    state: dict[str, torch.Tensor] = {}
    for name in expected_tensor_shapes(config):
        prefix = name[: -len(".weight")]
        if prefix in quantized:
            state.update({f"{prefix}.{k}": t.detach().cpu() for k, t in quantized[prefix].items()})
        else:
            state[name] = params[name].detach().to(dtype)
    for layer, (k, v) in sorted((kv_scales or {}).items()):
        p = f"model.layers.{layer}.self_attn."
        state[p + "k_scale"] = k.detach().float().cpu().contiguous()
        state[p + "v_scale"] = v.detach().float().cpu().contiguous()
    cfg = config.to_hf_dict()
    cfg["torch_dtype"] = _DTYPE_NAMES.get(dtype, "bfloat16")
    cfg["quantization_config"] = qconfig
    extra = {f: model_dir / f for f in COPIED_FILES if model_dir is not None and (model_dir / f).is_file()}
    kv_dtype = qconfig.get("meta", {}).get("kv_cache_dtype")
    if kv_json is None and kv_dtype is not None and kv_dtype != "fp8_e4m3":
        output.stderr.print(SGLANG_E5M2_WARNING)
    with tempfile.TemporaryDirectory() as td:
        if kv_json is not None:
            p = Path(td) / KV_SCALES_JSON
            p.write_text(json.dumps(kv_json, indent=2) + "\n")
            extra[KV_SCALES_JSON] = p
        return save_checkpoint(state, cfg, Path(out_dir), max_shard_bytes=max_shard_bytes,
                               extra_files=extra, overwrite=overwrite)

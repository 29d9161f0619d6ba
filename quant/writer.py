"""Write a GPTQ v1 checkpoint that vLLM/SGLang load as gptq_marlin (reference/quantization.md §2-3):
qweight/qzeros/scales/g_idx per quantized linear, everything else unquantized under its own name,
`quantization_config` in config.json, FP8 KV scales; tokenizer, generation config, the model code
config.json's auto_map names (for --trust-remote-code) and the license/notice/README copied.
Sharded safetensors + index, written to a temp dir and renamed (runtime/checkpoint_write.save_checkpoint).
"""

from __future__ import annotations

import json
import os
import re
from fnmatch import fnmatch
from pathlib import Path

import torch

import salactl
from salactl import output
from salactl.errors import CheckpointError
from salactl.quant.gptq import DAMP_STEP
from salactl.quant.sequential import QuantOptions
from salactl.runtime.checkpoint import StoredTensors, expected_tensor_shapes
from salactl.runtime.checkpoint_write import save_checkpoint
from salactl.runtime.config import SalaConfig
from salactl.runtime.kv_fp8 import SGLANG_E5M2_WARNING, fp8_dtype
from salactl.runtime.loader import DTYPES

COPIED_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "tokenizer.model",
                "generation_config.json", "chat_template.jinja", "added_tokens.json", "vocab.json",
                "merges.txt")
COPIED_PATTERNS = ("LICENSE*", "NOTICE*", "README.md")
KV_SCALES_JSON = "kv_cache_scales.json"
# HF modules -> the merged layer vLLM and SGLang build from them (their packed_modules_mapping)
ENGINE_MERGED = {("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"): "self_attn.qkv_proj",
                 ("mlp.gate_proj", "mlp.up_proj"): "mlp.gate_up_proj"}


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
        "meta": {
            "quantizer": [f"salactl:{salactl.__version__}"],
            "method": opts.method,
            "act_order": bool(opts.desc_act),
            "clip_search": bool(opts.clip_search),
            "unquantized_modules": ["model.embed_tokens", "lm_head"] + sorted(skipped),
        },
    }
    if opts.method == "gptq":          # how the solve ran; RTN has none (SGLang/vLLM read neither)
        qc.update(true_sequential=True, damp_percent=opts.damp, damp_auto_increment=DAMP_STEP)
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
    return DTYPES[config.torch_dtype]


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
                               overwrite: bool = False, source: StoredTensors | None = None) -> Path:
    """`quantized`: module prefix -> {qweight, qzeros, scales, g_idx} (packing.to_gptq_tensors);
    every other tensor comes from `source`, the checkpoint `model` was loaded from, bit for bit (cast
    only where a file's dtype is not its torch_dtype), or without one from `model` (quantized
    linears' in-memory weights are not written). `model_dir`: where the tokenizer and the other
    copied files are."""
    params = dict(model.named_parameters())
    dtype = stored_dtype(config)
    state: dict[str, torch.Tensor] = {}
    for name in expected_tensor_shapes(config):
        prefix = name[: -len(".weight")]
        if prefix in quantized:
            state.update({f"{prefix}.{k}": t.detach().cpu() for k, t in quantized[prefix].items()})
        else:
            t = source[name] if source is not None else params[name].detach()
            state[name] = t if t.dtype == dtype else t.to(dtype)
    for layer, (k, v) in sorted((kv_scales or {}).items()):
        p = f"model.layers.{layer}.self_attn."
        state[p + "k_scale"] = k.detach().float().cpu().contiguous()
        state[p + "v_scale"] = v.detach().float().cpu().contiguous()
    cfg = config.to_hf_dict()
    cfg["quantization_config"] = qconfig
    extra = copied_files(config, model_dir)
    kv_dtype = qconfig.get("meta", {}).get("kv_cache_dtype")
    if kv_json is None and kv_dtype is not None and kv_dtype != "fp8_e4m3":
        output.stderr.print(SGLANG_E5M2_WARNING)
    if kv_json is not None:     # written straight into the checkpoint's temp dir, not staged under TMPDIR
        extra[KV_SCALES_JSON] = (json.dumps(kv_json, indent=2) + "\n").encode()
    return save_checkpoint(state, cfg, Path(out_dir), extra_files=extra, overwrite=overwrite)


def copied_files(config: SalaConfig, model_dir: Path | None) -> dict[str, Path]:
    """Name in the output -> file of `model_dir` copied there: the tokenizer and generation config,
    the license, notice and README, and the Python files config.json's auto_map names (with those
    they import relatively, as transformers loads them), which SGLang/vLLM run under
    --trust-remote-code. An auto_map file that is missing gets a one-line warning; any of them that is
    a symlink to a missing target (a partial download into a Hub cache) is a CheckpointError."""
    if model_dir is None:
        return {}
    names = [f for f in COPIED_FILES if _is_file(model_dir / f)]
    # not glob: it leaves out a dangling symlink named by a pattern without wildcards (README.md)
    names += sorted(p.name for p in model_dir.iterdir()
                    if any(fnmatch(p.name, pattern) for pattern in COPIED_PATTERNS) and _is_file(p))
    for module in _auto_map_modules(dict(config.extra).get("auto_map")):
        f = model_dir / f"{module}.py"
        if not _is_file(f):
            output.stderr.print(f"warning: config.json's auto_map names {module}.py, which {model_dir} lacks; "
                                "the output cannot be loaded with --trust-remote-code without it")
            continue
        names += [f.name, *(p.name for p in _relative_imports(f))]
    return {name: model_dir / name for name in dict.fromkeys(names)}


def _is_file(path: Path) -> bool:
    """Whether `path` is a file to copy; a symlink to a missing target would be skipped as absent,
    leaving the checkpoint without it unnoticed, so it is an error."""
    if path.is_file():
        return True
    if path.is_symlink() and not path.exists():
        raise CheckpointError(f"{path} is a symlink to {os.readlink(path)}, which does not exist, so it cannot "
                              "be copied into the checkpoint; restore its target (download it again) or remove "
                              "the link")
    return False


def _auto_map_modules(auto_map) -> list[str]:
    """The local module names of auto_map's "module.Class" references (a reference to another Hub
    repository, "repo--module.Class", is fetched from there, not copied; a name that is no Python
    identifier, such as a path, names no file of the checkpoint)."""
    if not isinstance(auto_map, dict):
        return []
    refs = [r for v in auto_map.values() for r in (v if isinstance(v, list) else [v])]
    modules = [r.rpartition(".")[0] for r in refs if isinstance(r, str) and "--" not in r]
    return list(dict.fromkeys(m for m in modules if m.isidentifier()))


def _relative_imports(module: Path) -> list[Path]:
    """The files `module` imports relatively (`from .x import y`, `import .x`), recursively."""
    found: list[Path] = []
    todo = [module]
    while todo:
        text = todo.pop().read_text(encoding="utf-8", errors="replace")
        for name in re.findall(r"^\s*(?:from\s+\.(\S+)\s+import|import\s+\.(\S+)\s*$)", text, flags=re.MULTILINE):
            name = name[0] or name[1]
            f = module.parent / f"{name}.py"
            if name.isidentifier() and f not in found and f != module and _is_file(f):
                found.append(f)
                todo.append(f)
    return found

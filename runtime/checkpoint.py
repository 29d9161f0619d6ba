"""Hugging Face checkpoint I/O: expected tensor names/shapes, strict memory-mapped loading of
single or sharded safetensors, random weights built on the target device (writing:
runtime/checkpoint_write.py)."""

from __future__ import annotations

import json
import os
import re
from contextlib import contextmanager
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open

from salactl.errors import CheckpointError
from salactl.runtime.config import SPARSE, SalaConfig
from salactl.runtime.json_file import cannot_read, check_regular_file, read_json

INDEX_NAME = "model.safetensors.index.json"
SINGLE_NAME = "model.safetensors"
_IGNORED_SUFFIXES = (".rotary_emb.inv_freq", ".cos_cached", ".sin_cached")   # whole name parts only
_FLOAT_DTYPES = {"F16": "float16", "BF16": "bfloat16", "F32": "float32", "F64": "float64"}   # safetensors names
_LAYER_INDEX = re.compile(r"model\.layers\.(\d+)\.")


def expected_tensor_shapes(config: SalaConfig) -> dict[str, tuple[int, ...]]:
    hidden, inter = config.hidden_size, config.intermediate_size
    shapes = {
        "model.embed_tokens.weight": (config.vocab_size, hidden),
        "model.norm.weight": (hidden,),
        "lm_head.weight": (config.vocab_size, hidden),
    }
    for i, mixer in enumerate(config.mixer_types):
        p = f"model.layers.{i}."
        shapes[p + "input_layernorm.weight"] = (hidden,)
        shapes[p + "post_attention_layernorm.weight"] = (hidden,)
        shapes[p + "mlp.gate_proj.weight"] = (inter, hidden)
        shapes[p + "mlp.up_proj.weight"] = (inter, hidden)
        shapes[p + "mlp.down_proj.weight"] = (hidden, inter)
        a = p + "self_attn."
        if mixer == SPARSE:
            q, kv = config.num_attention_heads * config.head_dim, config.num_key_value_heads * config.head_dim
            shapes.update({a + "q_proj.weight": (q, hidden), a + "k_proj.weight": (kv, hidden),
                           a + "v_proj.weight": (kv, hidden), a + "o_proj.weight": (hidden, q),
                           a + "o_gate.weight": (q, hidden)})
        else:
            h, d = config.lightning_nh, config.lightning_head_dim
            for name in ("q_proj", "k_proj", "v_proj", "z_proj"):
                shapes[a + name + ".weight"] = (h * d, hidden)
            shapes[a + "o_proj.weight"] = (hidden, h * d)
            shapes[a + "q_norm.weight"] = (d,)
            shapes[a + "k_norm.weight"] = (d,)
            shapes[a + "o_norm.weight"] = (h * d,)
    return shapes


def check_every_layer_present(model_dir: Path, config: SalaConfig, names) -> None:
    """Refuse, from the tensor names alone, a checkpoint that holds no tensor of some layer config.json
    declares. Past this check the config has at most as many layers as the checkpoint, so
    expected_tensor_shapes (about 14 names a layer) stays the size of what is on disk: a config.json
    claiming millions of layers is refused at once, not after listing tens of millions of names."""
    held = {int(m.group(1)) for n in names if (m := _LAYER_INDEX.match(n))}
    layers = config.num_hidden_layers
    absent = next((i for i in range(layers) if i not in held), None)    # stops within len(held) + 1 steps
    if absent is None:
        return
    present = sum(1 for i in held if i < layers)
    more = layers - present - 1
    raise CheckpointError(f"checkpoint {model_dir} lacks tensor model.layers.{absent}.input_layernorm.weight and every "
                          f"other tensor of layer {absent}" + (f" (and of {more} more layers)" if more else "")
                          + f": config.json's num_hidden_layers is {layers} but the checkpoint holds tensors of "
                          f"{present} of them; point --model at the checkpoint this config.json belongs to, "
                          "or fix its num_hidden_layers and mixer_types")


@contextmanager
def open_safetensors(path: Path):
    """safe_open on CPU; a truncated or corrupt file is a one-line CheckpointError naming it, and so
    is one that cannot be opened, with the real reason (safetensors calls every failed open a
    missing file)."""
    _check_openable(path)
    try:
        with safe_open(path, framework="pt", device="cpu") as f:
            yield f
    except SafetensorError as e:
        raise CheckpointError(f"{path} is not a complete safetensors file ({str(e).splitlines()[0]}); "
                              "re-download or re-save the checkpoint") from None


def _check_openable(path: Path) -> None:
    fix = "re-download the checkpoint"
    try:
        check_regular_file(path, CheckpointError, 1 << 62, fix)     # a FIFO would block safe_open
        with open(path, "rb"):
            pass
    except OSError as e:
        raise cannot_read(path, e, CheckpointError, fix) from None


def tensor_files(model_dir: Path) -> dict[str, Path]:
    """Map every tensor name to the safetensors file holding it. As in transformers
    (`from_pretrained` looks for model.safetensors before model.safetensors.index.json), a
    model.safetensors wins and an index next to it is ignored: one checkpoint is never mixed
    from both."""
    single = model_dir / SINGLE_NAME
    if single.is_file():
        with open_safetensors(single) as f:
            return {name: single for name in f.keys()}
    index = model_dir / INDEX_NAME
    if not os.path.lexists(index):        # a dangling or looping symlink is there, and unreadable
        _refuse_pytorch_bin(model_dir)
        raise CheckpointError(f"{model_dir} has neither {SINGLE_NAME} nor {INDEX_NAME}; "
                              "finish the download or point --model at a complete checkpoint")
    files = {name: model_dir / f for name, f in _weight_map(index).items()}
    listed: dict[Path, set[str]] = {}
    for name, shard in files.items():
        listed.setdefault(shard, set()).add(name)
    held = {shard: _shard_keys(shard) for shard in listed}
    for name, shard in files.items():
        if name not in held[shard]:
            raise CheckpointError(f"{INDEX_NAME} maps tensor {name} to {shard.name}, but that shard does not contain "
                                  "it; fix the index's weight_map or re-download the checkpoint")
    for shard, names in listed.items():
        unlisted = sorted(n for n in held[shard] - names         # would be silently ignored
                          if not n.endswith(_IGNORED_SUFFIXES))      # (RoPE buffers are, rightly)
        if unlisted:
            raise CheckpointError(f"shard {shard.name} holds tensor {unlisted[0]}, which {INDEX_NAME} does not list "
                                  "for it; fix the index's weight_map or re-download the checkpoint")
    return files


def _refuse_pytorch_bin(model_dir: Path) -> None:
    """A complete checkpoint saved as PyTorch pickles (pytorch_model.bin, or its shards and index) is
    not a download that stopped early: say that salactl reads safetensors only, and how to convert it."""
    bins = sorted(model_dir.glob("pytorch_model*.bin"))
    if not bins:
        return
    shards, single = str(model_dir / "pytorch_model*.bin"), str(model_dir / SINGLE_NAME)
    raise CheckpointError(
        f"{model_dir} holds PyTorch .bin weights ({bins[0].name}{', ...' if len(bins) > 1 else ''}), but salactl reads "
        f"only safetensors; convert them: python -c \"import glob, torch; from safetensors.torch import save_file; "
        f"sd = {{}}; [sd.update((k, v.clone()) for k, v in torch.load(f, weights_only=True).items()) "
        f"for f in sorted(glob.glob({shards!r}))]; "
        f"save_file(sd, {single!r}, metadata={{'format': 'pt'}})\"")


class StoredTensors:
    """A checkpoint directory's tensors read one at a time, as stored (dtype and bits), without the
    rest in memory: the source precision that quantize solves from and copies unquantized tensors
    from, whatever dtype the model was loaded in."""

    def __init__(self, model_dir: Path):
        self.files = tensor_files(Path(model_dir))

    def __getitem__(self, name: str) -> torch.Tensor:
        with open_safetensors(self.files[name]) as f:
            return f.get_tensor(name)


def _weight_map(index: Path) -> dict[str, str]:
    """The index's weight_map, refused whole before any shard is opened: each value must be a file
    name inside the model directory (a relative path without '..'; a symlinked shard is fine)."""
    fix = "fix or re-download the index"
    try:
        d = read_json(index, CheckpointError, fix)
    except OSError as e:
        raise cannot_read(index, e, CheckpointError, fix) from None
    weight_map = d.get("weight_map") if isinstance(d, dict) else None
    if weight_map is None:
        raise CheckpointError(f"{index} is not a valid safetensors index (needs a 'weight_map' object)")
    if not isinstance(weight_map, dict):
        raise CheckpointError(f"{index} has a 'weight_map' that is a {type(weight_map).__name__}, not an object "
                              "mapping tensor names to shard files; fix or re-download the index")
    for name, f in weight_map.items():
        if not isinstance(f, str) or not f:
            raise CheckpointError(f"{index} maps tensor {name} to {json.dumps(f)}, not a shard file name; "
                                  "fix or re-download the index")
        if Path(f).is_absolute() or ".." in Path(f).parts:
            raise CheckpointError(f"{index} maps tensor {name} to {f}, outside the model directory; a shard "
                                  "must be a file name in the checkpoint's directory: fix or re-download the index")
    return weight_map


def _shard_keys(shard: Path) -> set[str]:
    if not os.path.lexists(shard):
        raise CheckpointError(f"shard {shard} named in {INDEX_NAME} does not exist; "
                              "re-download the checkpoint or fix the index")
    with open_safetensors(shard) as f:
        return set(f.keys())


def load_state_dict(model_dir: Path, expected: dict[str, tuple[int, ...]], device, dtype,
                    allow_extra: tuple[str, ...] = ()) -> dict[str, torch.Tensor]:
    """Strictly load `expected` tensors (memory-mapped, cast once on the way to `device`).
    `allow_extra` are name suffixes another loader handles (e.g. GPTQ's qweight)."""
    files = tensor_files(model_dir)
    names = {n for n in files if not n.endswith(_IGNORED_SUFFIXES)}
    missing = sorted(set(expected) - names)
    if missing:
        hint = ""
        if missing[0].removesuffix(".weight") + ".qweight" in names:
            hint = ("; it has GPTQ tensors (.qweight) but neither config.json nor quantize_config.json "
                    "holds a quantization_config")
        raise CheckpointError(f"checkpoint {model_dir} lacks tensor {missing[0]}"
                              + (f" (and {len(missing) - 1} more)" if len(missing) > 1 else "") + hint)
    extra = sorted(n for n in names - set(expected) if not n.endswith(allow_extra))
    if extra:
        raise CheckpointError(f"checkpoint {model_dir} has unexpected tensor {extra[0]}"
                              + (f" (and {len(extra) - 1} more)" if len(extra) > 1 else "")
                              + "; it does not match config.json")
    by_file: dict[Path, list[str]] = {}
    for n in expected:
        by_file.setdefault(files[n], []).append(n)
    out: dict[str, torch.Tensor] = {}
    for path, group in by_file.items():
        with open_safetensors(path) as f:
            for n in group:
                sl = f.get_slice(n)
                shape = tuple(sl.get_shape())
                if shape != expected[n]:
                    raise CheckpointError(f"tensor {n} has shape {list(shape)} but config.json implies "
                                          f"{list(expected[n])}")
                _require_float(n, sl.get_dtype())
                out[n] = f.get_tensor(n).to(device=device, dtype=dtype)
    return out


def _require_float(name: str, safetensors_dtype: str) -> None:
    """Casting integer, bool or FP8 data to float would run garbage: such a tensor means a quantized
    checkpoint whose quantization_config is missing or not recognised."""
    if safetensors_dtype not in _FLOAT_DTYPES:
        raise CheckpointError(f"tensor {name} has dtype {safetensors_dtype}; a full-precision tensor needs "
                              f"{'/'.join(_FLOAT_DTYPES.values())}, and a quantized checkpoint needs its "
                              "quantization_config (config.json or quantize_config.json)")


def random_state_dict(config: SalaConfig, device, dtype, seed: int = 0) -> dict[str, torch.Tensor]:
    """Random weights of the real shapes, generated directly on `device` (no CPU detour).

    Drawn in fp32 and rounded to `dtype`, so one seed gives one model in every dtype: torch's
    normal_ draws a different stream for 16-bit tensors in some versions and sizes (2.11 on CPU;
    2.13 past 16 elements but not a multiple of 16)."""
    gen = torch.Generator(device=device).manual_seed(seed)
    out = {}
    for name, shape in expected_tensor_shapes(config).items():
        if len(shape) == 1:
            out[name] = torch.ones(shape, device=device, dtype=dtype)
        else:
            std = config.initializer_range if "embed" in name else shape[1] ** -0.5
            t = torch.empty(shape, device=device, dtype=torch.float32).normal_(0.0, std, generator=gen)
            out[name] = t.to(dtype)
    return out

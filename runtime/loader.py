"""Resolve `--model PATH|PRESET` to a ready model: a checkpoint directory, the embedded
`sala-nano`, or random weights of a preset's shapes built on the target device."""

from __future__ import annotations

import json
import math
import numbers
import os
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn
from torch.overrides import TorchFunctionMode

from salactl.errors import CapacityError, CheckpointError, ConfigError, DeviceError, UsageError
from salactl.runtime.checkpoint import (INDEX_NAME, SINGLE_NAME, check_every_layer_present, expected_tensor_shapes,
                                        load_state_dict, random_state_dict, tensor_files)
from salactl.runtime.config import SalaConfig
from salactl.runtime.host_memory import available_host_bytes, check_fits
from salactl.runtime.json_file import is_dir, lookup, read_optional_json
from salactl.runtime.layers.model import SalaForCausalLM
from salactl.runtime.presets import PRESETS, preset
from salactl.runtime.sampling import is_int

EMBEDDED_DIR = Path(__file__).parent / "models" / "sala-nano"
DTYPES = {"bfloat16": torch.bfloat16, "bf16": torch.bfloat16, "float16": torch.float16,
          "fp16": torch.float16, "float32": torch.float32, "fp32": torch.float32}


@dataclass
class LoadedModel:
    """What load_model returns: the module (eval mode, no grad) with its config, the directory
    holding its tokenizer.json / generation_config.json, and a label of where it came from."""

    model: SalaForCausalLM
    config: SalaConfig
    model_dir: Path | None      # where tokenizer / generation config live (None for random presets)
    source: str


def resolve_device(device: str | torch.device | None) -> torch.device:
    """A device name ("cpu", "cuda", "cuda:N"; None or "auto" = cuda when visible, else cpu) or a
    torch.device. A name that is none of these is a UsageError; one this machine lacks (cuda without
    a GPU, cuda:7 with one) is a DeviceError."""
    if device is None or device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError):
        dev = None
    if dev is None or dev.type not in ("cpu", "cuda"):
        raise UsageError(f"device (--device) {str(device)!r} is unknown; use auto, cpu, cuda or cuda:N")
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise DeviceError(f"device (--device) {device} was asked for but no CUDA GPU is visible; use cpu")
    if dev.type == "cuda" and dev.index is not None and dev.index >= torch.cuda.device_count():
        n = torch.cuda.device_count()
        raise DeviceError(f"device (--device) {device}: this machine has {n} CUDA GPU(s), "
                          f"cuda:0 to cuda:{n - 1}")
    return dev


def resolve_dtype(name: str | torch.dtype | None, device: torch.device) -> torch.dtype:
    """A dtype name (bf16, fp16, fp32 and their long forms; None or "auto" = bf16 on CUDA, fp32
    on CPU) or one of those torch.dtypes."""
    if isinstance(name, torch.dtype) and name in DTYPES.values():
        return name
    if name is None or name == "auto":
        # CPUs without bf16 matrix units run bf16 GEMMs ~2x slower than fp32 (measured on the
        # dev machine), and fp32 from a bf16 checkpoint is exact; GPUs run bf16.
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    try:
        return DTYPES[name]
    except (KeyError, TypeError):
        raise UsageError(f"dtype (--dtype) {name!r} is unknown; valid: auto, {', '.join(sorted(DTYPES))}") \
            from None


class _SkipParamInit(TorchFunctionMode):
    """Makes nn.init's kaiming_uniform_ / uniform_ / normal_ return their tensor untouched.
    Modules built on the meta device still run nn.init, which on meta tensors drags in
    torch._dynamo (0.8 s of imports on the dev machine); every weight is replaced by the
    checkpoint anyway. A torch function mode applies only to the thread that enters it, so other
    threads' nn.init calls (and nn.init itself) are left alone."""

    SKIPPED = frozenset({nn.init.kaiming_uniform_, nn.init.uniform_, nn.init.normal_})

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in self.SKIPPED:
            return kwargs["tensor"] if "tensor" in kwargs else args[0]
        return func(*args, **kwargs)


def meta_model(config: SalaConfig) -> SalaForCausalLM:
    """The module tree with every tensor on the meta device, to be filled by load_state_dict(assign=True)."""
    with torch.device("meta"), _SkipParamInit():
        return SalaForCausalLM(config)


def build_model(config: SalaConfig, state: dict[str, torch.Tensor]) -> SalaForCausalLM:
    model = meta_model(config)
    model.load_state_dict(state, strict=True, assign=True)
    return model.eval().requires_grad_(False)


def check_host_memory(config: SalaConfig, dtype: torch.dtype, device: torch.device, name: str) -> None:
    """On CPU, refuse unquantized weights larger than the available host memory before allocating
    them: otherwise the kernel's OOM killer ends the process mid-load, with no message."""
    if device.type != "cpu":
        return
    from salactl.units import human_bytes

    params = config.parameter_count()
    half = "" if dtype.itemsize <= 2 else f"dtype bf16 (--dtype bf16, {human_bytes(params * 2)}), "
    check_fits(params * torch.finfo(dtype).bits // 8, available_host_bytes(),
               f"{name} in {str(dtype).removeprefix('torch.')} (its weights)", "this machine",
               f"use {half}a GPU (device cuda, --device cuda) or a W4A16 checkpoint (salactl quantize)")


def available_bytes(device: torch.device) -> int | None:
    """Memory a new allocation on `device` can take: MemAvailable on CPU, the free memory of a
    CUDA device; None where that is unknown."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    return available_host_bytes() if device.type == "cpu" else None


def _model_name(model: str | Path | None) -> str:
    """None means the embedded sala-nano; an empty name is a mistake, not a request for it."""
    if model is None:
        return "sala-nano"
    if not str(model).strip():
        raise UsageError(f"model (--model) is empty; give a checkpoint directory or a preset "
                         f"({', '.join(sorted(PRESETS))})")
    return str(model)


def _is_preset(model: str | Path | None, name: str) -> bool:
    """A bare preset name (a str, or None for sala-nano) means the preset from any working directory,
    so the README's commands do what they say; anything with a path separator or a leading ./ is a
    path. A Path object drops the ./, so Path("sala-nano") is the directory where one exists, else
    the preset."""
    if name not in PRESETS:
        return False
    if isinstance(model, os.PathLike):
        try:
            return not Path(model).is_dir()
        except OSError:
            return True
    return True


def _resolve_source(model: str | Path | None, random_weights: bool) -> tuple[str, Path | None, SalaConfig]:
    """(name, directory, config) of what load_model loads, read without any weights. The directory
    holds the tokenizer and generation_config.json: None for random weights of a preset other than
    sala-nano."""
    name = _model_name(model)
    path = Path(name)
    if _is_preset(model, name):
        return _preset_source(name, random_weights)
    if random_weights:
        if not (_is_dir(path) and lookup(path / "config.json", CheckpointError)):
            raise ConfigError(f"random_weights (--random-weights) needs a preset "
                              f"({', '.join(sorted(PRESETS))}) or a directory with config.json, got {name!r}")
    elif not _is_dir(path):
        raise CheckpointError(f"{name!r} is neither a checkpoint directory nor a preset "
                              f"({', '.join(sorted(PRESETS))})")
    return name, path, SalaConfig.from_file(path / "config.json")


def _preset_source(name: str, random_weights: bool) -> tuple[str, Path | None, SalaConfig]:
    try:                    # a directory of the preset's name in the working directory (unsearchable: none)
        shadowed = Path(name).is_dir()
    except OSError:
        shadowed = False
    if name != "sala-nano" and not random_weights:
        local = f" (--model ./{name} loads the directory ./{name} here)" if shadowed else ""
        raise CheckpointError(f"preset {name!r} has no embedded weights; pass random_weights=True "
                              f"(--random-weights) or a checkpoint directory{local}")
    if shadowed:
        from salactl.output import warn_once

        warn_once(f"model (--model) {name!r} is the {name} preset, not the directory ./{name} here; "
                  f"--model ./{name} loads that directory")
    if random_weights:
        embedded = name == "sala-nano" and EMBEDDED_DIR.exists()
        return name, EMBEDDED_DIR if embedded else None, preset(name)
    if not (EMBEDDED_DIR / "config.json").exists():
        raise CheckpointError("the embedded sala-nano checkpoint is missing from this install; "
                              "reinstall salactl or pass random_weights=True (--random-weights)")
    return name, EMBEDDED_DIR, SalaConfig.from_file(EMBEDDED_DIR / "config.json")


def _is_dir(path: Path) -> bool:
    return is_dir(path, CheckpointError, "model (--model)")


def model_config(model: str | Path | None = None, random_weights: bool = False) -> SalaConfig:
    """The config load_model(model, random_weights=...) would build, with the same errors, but no
    weights read: for checks that must come before loading."""
    return _resolve_source(model, random_weights)[2]


def planning_config(model: str | Path | None = None) -> SalaConfig:
    """A preset's shapes or a checkpoint's config.json, for estimates made without weights (a preset
    needs no random_weights here)."""
    return model_config(model, random_weights=_is_preset(model, _model_name(model)))


def model_quantization(model: str | Path | None = None, random_weights: bool = False) -> dict | None:
    """The quantization config load_model would load `model` with (config.json's or a standalone
    quantize_config.json), None for full-precision checkpoints and random weights; no weights read.
    A checkpoint without weight files (a download that stopped after config.json) is load_model's
    CheckpointError here already: callers check memory next, which would refuse it with wrong advice."""
    _, path, config = _resolve_source(model, random_weights)
    if random_weights:
        return None
    # as tensor_files looks: a model.safetensors that is no file (a dangling Hub-cache link) is absent
    if not ((path / SINGLE_NAME).is_file() or os.path.lexists(path / INDEX_NAME)):
        tensor_files(path)          # raises its "has neither ..." error; their contents are checked on loading
    return quantization_config(path, config)


def model_dir(model: str | Path | None = None, random_weights: bool = False) -> Path | None:
    """The LoadedModel.model_dir load_model(model, random_weights=...) gives, with the same errors,
    but no weights read: for the tokenizer and generation_config.json before loading."""
    return _resolve_source(model, random_weights)[1]


def load_model(model: str | Path | None = None, device=None, dtype: str | torch.dtype | None = None,
               random_weights: bool = False, seed: int = 0) -> LoadedModel:
    """Load a model for Engine / GPUEngine.

    model: a checkpoint directory or a preset name (None = "sala-nano", whose weights ship with
    salactl; other presets need random_weights=True; "" is an error). device: "cpu", "cuda",
    "cuda:N" or a torch.device (None/"auto" = cuda when visible, else cpu). dtype:
    "bf16"/"fp16"/"fp32" or a torch.dtype (None/"auto" = bf16 on CUDA, fp32 on CPU).
    random_weights: random weights of the preset's / config.json's shapes, drawn with `seed`.
    Errors are SalactlError subclasses (CheckpointError, ConfigError, DeviceError, UsageError,
    CapacityError).

    A checkpoint directory that another process replaced while it was read (`salactl quantize
    --overwrite` renames a new one onto it) could give one checkpoint's config.json and the other's
    weights: the load then runs once more, from the new directory."""
    dev = resolve_device(device)
    for last_try in (False, True):
        with _DirectoryPin(model) as pin:
            try:
                loaded = _load_once(model, dev, dtype, random_weights, seed)
            except Exception as e:
                if not pin.replaced():
                    raise
                if last_try:
                    raise pin.replaced_error() from e
                continue
            if not pin.replaced():
                return loaded
            loaded = None               # before the next try loads a second copy
    raise pin.replaced_error()


class _DirectoryPin:
    """Holds a checkpoint directory open while it loads and tells, at the end, whether its path names
    another directory by then. The open handle keeps the directory's inode from being reused by the
    replacement even after the old directory is deleted, so an unchanged (st_dev, st_ino) means
    every file was read from the one directory."""

    def __init__(self, model: str | Path | None):
        self.path, self.fd, self.missing = None, None, False
        if model is None or not str(model).strip() or _is_preset(model, str(model)):
            return
        self.path = Path(str(model))
        try:
            self.fd = os.open(self.path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
        except FileNotFoundError:       # also between a swap's two renames, when it is aside
            self.missing = True
        except (OSError, ValueError):   # ValueError: an embedded NUL
            pass                        # no directory (or Windows): the load says what is wrong

    def __enter__(self) -> "_DirectoryPin":
        return self

    def __exit__(self, *exc) -> None:
        if self.fd is not None:
            os.close(self.fd)

    def replaced(self) -> bool:
        if self.fd is None:
            return self.missing and os.path.isdir(self.path)
        held = os.fstat(self.fd)
        try:
            now = os.stat(self.path)
        except OSError:
            return True
        return (now.st_dev, now.st_ino) != (held.st_dev, held.st_ino)

    def replaced_error(self) -> CheckpointError:
        return CheckpointError(f"{self.path} was replaced while it was being read (another salactl quantize "
                               "--overwrite?); run again once that has finished")


def _load_once(model: str | Path | None, dev: torch.device, dtype: str | torch.dtype | None,
               random_weights: bool, seed: int) -> LoadedModel:
    name, path, config = _resolve_source(model, random_weights)
    dt = resolve_dtype(dtype, dev)
    if random_weights:
        check_host_memory(config, dt, dev, name)
        state = random_state_dict(config, dev, dt, seed)
        return LoadedModel(build_model(config, state), config, path, f"random:{name}:seed={seed}")
    generation_eos_ids(path, config.vocab_size)          # a bad generation_config.json fails here, not mid-run
    quant = quantization_config(path, config)
    # each path refuses layers config.json claims and the checkpoint lacks before listing every layer's tensors
    if quant is not None:
        from salactl.quant.loading import load_gptq_model

        check_every_layer_present(path, config, tensor_files(path))
        return LoadedModel(load_gptq_model(path, config, quant, dev, dt), config, path, str(path))
    from salactl.quant.loading import KV_SCALE_SUFFIXES, attach_kv_scales

    files = tensor_files(path)          # headers only: missing weight files are exit 4, before any memory check
    check_host_memory(config, dt, dev, str(path))
    check_every_layer_present(path, config, files)
    state = load_state_dict(path, expected_tensor_shapes(config), dev, dt, allow_extra=KV_SCALE_SUFFIXES)
    model = build_model(config, state)
    attach_kv_scales(model, config, files, dev)
    return LoadedModel(model, config, path, str(path))


def quantization_config(path: Path, config: SalaConfig | None = None) -> dict | None:
    """config.json's quantization_config (from `config` when already parsed), else AutoGPTQ's
    standalone quantize_config.json (which vLLM also reads; it may lack quant_method, the file name
    itself says GPTQ)."""
    if config is None:
        config = SalaConfig.from_file(path / "config.json")
    qc = dict(config.extra).get("quantization_config")
    if qc is not None:
        return qc
    qc = read_optional_json(path / "quantize_config.json", CheckpointError)
    if isinstance(qc, dict):
        qc.setdefault("quant_method", "gptq")
    return qc


def _generation_config(model_dir: Path | None) -> tuple[Path | None, dict]:
    """generation_config.json (the file is optional) and its JSON object, {} without one."""
    if model_dir is None:
        return None, {}
    f = Path(model_dir) / "generation_config.json"
    d = read_optional_json(f, CheckpointError, missing={})
    if not isinstance(d, dict):
        raise CheckpointError(f"{f} must hold a JSON object, not a {type(d).__name__}; fix or remove it")
    return f, d


def generation_eos_ids(model_dir: Path | None, vocab_size: int | None = None) -> tuple[int, ...]:
    """generation_config.json's eos_token_id (an int or a list; the file is optional), which HF
    `generate()` stops at; with `vocab_size`, an id outside [0, vocab_size) is refused too."""
    f, d = _generation_config(model_dir)
    eos = d.get("eos_token_id")
    if eos is None:
        return ()
    ids = eos if isinstance(eos, list) else [eos]
    if not all(is_int(i) for i in ids):
        raise CheckpointError(f"{f} has eos_token_id = {json.dumps(eos)}; expected an integer or a list of integers")
    outside = [i for i in ids if vocab_size is not None and not 0 <= i < vocab_size]
    if outside:
        raise CheckpointError(f"{f} has eos_token_id {outside[0]}, outside the model's vocabulary [0, {vocab_size}); "
                              "fix or remove it")
    return tuple(ids)


def _number(v) -> bool:
    return isinstance(v, numbers.Real) and not isinstance(v, bool)


# generation_config.json's sampling and length keys: (valid?, what is expected)
GENERATION_KEYS = {
    "do_sample": (lambda v: isinstance(v, bool), "true or false"),
    "temperature": (lambda v: _number(v) and 0 <= v < math.inf, "a finite number >= 0"),
    "top_p": (lambda v: _number(v) and 0 < v <= 1, "a number in (0, 1]"),
    "top_k": (lambda v: is_int(v) and v >= 0, "an integer >= 0 (0 = off)"),
    "max_new_tokens": (lambda v: is_int(v) and v >= 0, "an integer >= 0"),
    "max_length": (lambda v: is_int(v) and v >= 1, "an integer >= 1"),
    "repetition_penalty": (lambda v: _number(v) and 0 < v < math.inf, "a finite number > 0 (1 = off)"),
    "no_repeat_ngram_size": (lambda v: is_int(v) and v >= 0, "an integer >= 0 (0 = off)"),
    "min_new_tokens": (lambda v: is_int(v) and v >= 0, "an integer >= 0"),
    "min_p": (lambda v: _number(v) and 0 <= v <= 1, "a number in [0, 1] (0 = off)"),
}

# generation_config.json keys that change HF generate()'s output and that salactl does not apply,
# with their neutral values (None, false and an empty list are neutral too)
UNAPPLIED_GENERATION_KEYS = {
    "typical_p": 1.0, "epsilon_cutoff": 0.0, "eta_cutoff": 0.0, "num_beams": 1, "num_beam_groups": 1,
    "min_length": 0, "bad_words_ids": None, "suppress_tokens": None, "begin_suppress_tokens": None,
    "forced_bos_token_id": None, "forced_eos_token_id": None, "sequence_bias": None,
    "exponential_decay_length_penalty": None, "diversity_penalty": 0.0, "renormalize_logits": False,
    "guidance_scale": 1.0, "penalty_alpha": None, "encoder_repetition_penalty": 1.0,
    "encoder_no_repeat_ngram_size": 0, "stop_strings": None, "dola_layers": None, "watermarking_config": None,
}


def generation_defaults(model_dir: Path | None) -> dict:
    """The GENERATION_KEYS that generation_config.json sets (null: unset), which HF `generate()`,
    vLLM and SGLang take as a request's defaults; a malformed value is a CheckpointError."""
    f, d = _generation_config(model_dir)
    found = {}
    for key, (valid, expected) in GENERATION_KEYS.items():
        value = d.get(key)
        if value is None:
            continue
        if not valid(value):
            raise CheckpointError(f"{f} has {key} = {json.dumps(value)}; expected {expected}; fix or remove it")
        found[key] = value
    return found


def unapplied_generation_settings(model_dir: Path | None) -> dict:
    """generation_config.json's UNAPPLIED_GENERATION_KEYS whose values are not neutral: settings
    HF generate() would apply and salactl does not."""
    _, d = _generation_config(model_dir)
    return {key: d[key] for key, neutral in UNAPPLIED_GENERATION_KEYS.items()
            if d.get(key) not in (None, False, [], {}, neutral)}


def stop_token_ids(config: SalaConfig, model_dir: Path | None, tokenizer=None) -> tuple[int, ...]:
    """The ids generation stops at (unless ignore_eos): config.json's eos_token_id, generation_config.json's
    eos_token_id and the tokenizer's eos token and <|im_end|>. `run`, `eval passkey` and the embedded
    bench target all use this set."""
    from salactl.runtime.tokenizer import Tokenizer

    if not isinstance(config, SalaConfig):
        raise UsageError(f"stop_token_ids takes the model's SalaConfig (LoadedModel.config), got {type(config).__name__}")
    if model_dir is not None and not isinstance(model_dir, (str, os.PathLike)):
        raise UsageError(f"stop_token_ids takes the model's directory (LoadedModel.model_dir) or None, "
                         f"got {type(model_dir).__name__}")
    if tokenizer is not None and not isinstance(tokenizer, Tokenizer):
        raise UsageError(f"stop_token_ids takes a salactl Tokenizer (find_tokenizer) or None, got {type(tokenizer).__name__}")
    ids = (*config.eos_token_id, *generation_eos_ids(model_dir), *(tokenizer.eos_ids if tokenizer else ()))
    return tuple(dict.fromkeys(ids))

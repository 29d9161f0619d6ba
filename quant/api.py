"""`salactl quantize` as one Python call: check the inputs and build the calibration windows (before
any weights load), load the model (or take one already loaded), quantize layer by layer, write the
GPTQ checkpoint (atomically: nothing is written unless all of it is) and return the summary record
`salactl quantize --json` prints."""

from __future__ import annotations

import time
from copy import deepcopy
from dataclasses import replace
from pathlib import Path
from typing import Callable

import torch

from salactl import input_files, output
from salactl.bench.out_of_memory import out_of_memory_is_capacity
from salactl.env import environment
from salactl.errors import CheckpointError, OutputExistsError, QuantizationError, SalactlError, UsageError
from salactl.quant.calibration import RANDOM, calibration_windows, check_calibration_sizes
from salactl.quant.in_memory import quantized_as
from salactl.quant.sequential import (QuantizeOutcome, QuantOptions, layer_groups, quantize_model,
                                      widest_quantized_input)
from salactl.quant.writer import copied_files, quantization_config, write_quantized_checkpoint
from salactl.runtime.checkpoint import StoredTensors, tensor_files
from salactl.runtime.checkpoint_write import check_output_dir
from salactl.runtime.config import SalaConfig
from salactl.runtime.kv_fp8 import fp8_dtype, sglang_scales_json
from salactl.runtime.loader import (LoadedModel, available_bytes, check_fits, load_model, model_config,
                                    model_quantization, resolve_device, resolve_dtype, stop_token_ids)
from salactl.runtime.loader import model_dir as checkpoint_dir
from salactl.runtime.tokenizer import Tokenizer, find_tokenizer

# (done, total, label): once with done=0 before the first module group, then after each group
ProgressCallback = Callable[[int, int, str], None]


def quantize_checkpoint(model: str | Path | LoadedModel, out: str | Path, opts: QuantOptions = QuantOptions(),
                        *, calib: str | Path | None = None, nsamples: int = 128, seqlen: int = 2048,
                        tokenizer: str | Path | None = None, seed: int = 0, device: str = "auto",
                        dtype: str = "auto", random_weights: bool = False, overwrite: bool = False,
                        copy: bool = False, progress: ProgressCallback | None = None) -> dict:
    """Quantize `model` with `opts` and write a GPTQ (Marlin-compatible) checkpoint to `out`;
    returns the summary record (JSON-ready dict) that `salactl quantize --json` prints.

    model: a checkpoint directory or preset name, loaded here with device, dtype, random_weights
    and seed as load_model does; or a LoadedModel. dtype is only what the calibration forwards run
    in: from a checkpoint directory, each linear is quantized from its stored weight and every
    other tensor is copied as stored. An in-memory model (and random weights) is quantized and
    written from its own weights, in place: its float weights are replaced by their dequantized
    values (what the checkpoint holds), as quantize_model does. copy=True quantizes a deep copy
    instead and leaves it untouched, at the cost of a second copy of the model in memory.
    calib: a text or JSONL ("text" field) file, "random" for random token ids, or None for the
    built-in corpus; nsamples windows of seqlen tokens, tokenized with `tokenizer` (default: the
    model's own). RTN without FP8 KV scales needs no calibration and skips it unless calib is
    given (a tokenizer is then refused). With random_weights and no tokenizer found, calibration
    falls back to random ids.
    out: must not exist, or overwrite=True to replace a checkpoint there; never the model's own
    directory, one inside it or one holding it.
    Every check that needs no weights (the output, the calibration data and tokenizer, an already
    quantized source, the files copied beside the weights) runs before the model loads.
    progress: called as progress(done, total, label) per module group (None: silent). Notes and
    warnings go to stderr, as the CLI's do. Errors are SalactlError subclasses (salactl.errors)."""
    if not str(out).strip():
        raise UsageError("out (--out) is empty; give a directory")
    check_output_dir(Path(out), overwrite)
    check_calibration_sizes(nsamples, seqlen)      # also for RTN: a bad value is an error even when unused
    if calib is not None and not str(calib).strip():
        raise UsageError("calib (--calib) is empty; give a text or JSONL file, or random")
    if tokenizer is not None and not str(tokenizer).strip():
        raise UsageError("tokenizer (--tokenizer) is empty; give a tokenizer.json or its directory, or leave it "
                         "out for the model's own")
    if str(calib) == RANDOM and tokenizer is not None:
        raise UsageError("tokenizer (--tokenizer) is unused with calib (--calib) random, which draws random "
                         "token ids; drop one of them")
    if not needs_calibration(opts, calib) and tokenizer is not None:
        raise UsageError("tokenizer (--tokenizer) is unused: RTN without calib (--calib) or an FP8 kv_cache_dtype "
                         "(--kv-cache-dtype) reads no calibration data; drop it, or add calib (--calib)")
    t_start = time.perf_counter()
    config, model_dir = _unquantized_source(model, device, dtype, random_weights)
    _check_out_is_not_the_source(out, model_dir)
    _check_copied_files(config, model_dir)
    plan = _calibration_plan(model_dir, opts, calib, tokenizer, random_weights)
    if plan is not None and plan[0] == RANDOM:
        # random ids are drawn whole (a text's windows stop where it ends): check their size first
        _check_memory(model, config, device, dtype, (nsamples, seqlen))
    windows = None if plan is None else _calibration_windows(config, model_dir, *plan, nsamples, seqlen, seed)
    fit = _calibration_fit(config, opts, windows)
    # a given tokenizer is refused where it would be unused: here plan holds it
    knobs = _knobs(model, opts, device, dtype, random_weights, seed, nsamples, seqlen, windows,
                   None if plan is None else _calibration_source(plan[0]),
                   None if tokenizer is None else str(plan[1].path.resolve()))
    _check_memory(model, config, device, dtype, None if windows is None else tuple(windows.shape))
    lm = model if isinstance(model, LoadedModel) else load_model(model, device, dtype, random_weights, seed)
    if copy and lm is model:
        lm = replace(lm, model=deepcopy(lm.model))
    # the stored tensors, where the model was loaded from a checkpoint here (the in-memory weights
    # are in the calibration dtype)
    source = None if isinstance(model, LoadedModel) or random_weights else StoredTensors(lm.model_dir)
    t_loaded = time.perf_counter()
    with out_of_memory_is_capacity("quantize", "lower nsamples (--nsamples), seqlen (--seqlen) or batch_tokens "
                                   "(--batch-tokens)"):
        result = quantize_model(lm.model, lm.config, windows, opts, progress=_counted(progress, lm.config),
                                source=source)
    for line in result.damp_raised:
        output.stderr.print(f"note: Cholesky failed at the requested damping; raised {line}")
    if fit["calibration_underdetermined"] and opts.method == "gptq":
        output.stderr.print(f"warning: {int(windows.numel()):,} calibration tokens are fewer than the "
                            f"{fit['widest_in_features']:,} inputs of the widest quantized linear, so its Hessian "
                            "is rank-deficient: the err columns (and 'error below RTN') are in-sample fits, not "
                            "the error on other text; give more calibration text (--calib, --nsamples, --seqlen)")
    t_solved = time.perf_counter()
    with out_of_memory_is_capacity("quantize's checkpoint write", "free memory for it (it maps each source "
                                   "shard in turn) and run again"):
        _write(out, lm, opts, result, overwrite, source, knobs)
    t_done = time.perf_counter()
    seconds = {"load_and_calibration_data": t_loaded - t_start, "forward": result.forward_seconds,
               "solve": result.solve_seconds, "quantize_total": t_solved - t_loaded,
               "write": t_done - t_solved, "total": t_done - t_start}
    return _record(out, lm, opts, fit, knobs, result, seconds,
                   lm.model_dir if source is not None else None)


def needs_calibration(opts: QuantOptions, calib: str | Path | None) -> bool:
    """GPTQ reads activations; RTN only for FP8 KV scales, or when `calib` asks for each module's error."""
    return opts.method != "rtn" or calib is not None or fp8_dtype(opts.kv_cache_dtype) is not None


def _unquantized_source(model: str | Path | LoadedModel, device: str, dtype: str,
                        random_weights: bool) -> tuple[SalaConfig, Path | None]:
    """The config and directory (tokenizer, copied files) of what will be quantized, read without
    loading any weights; an already quantized model is refused."""
    if isinstance(model, LoadedModel):
        _check_load_arguments(model, device, dtype, random_weights)
        name, quantized, config, model_dir = model.source, quantized_as(model.model), model.config, model.model_dir
    else:
        name, quantized = model, model_quantization(model, random_weights)
        config, model_dir = model_config(model, random_weights), checkpoint_dir(model, random_weights)
    if quantized:
        raise QuantizationError(f"{name} is already quantized; quantize the original checkpoint")
    return config, model_dir


def _check_out_is_not_the_source(out: str | Path, model_dir: Path | None) -> None:
    """Writing to the model's own directory, one inside it or one holding it would replace (with
    overwrite) or mix into the checkpoint being read. Directories are compared by identity, not by
    name: on a case-insensitive file system (macOS, Windows) or through a bind mount, two different
    paths can name the checkpoint."""
    if model_dir is None:
        return
    o, m = Path(out).expanduser().resolve(), Path(model_dir).expanduser().resolve()
    source, out_dir = _identity(m), _identity(o)
    if source is None:
        return
    if out_dir == source:
        where = "is"
    elif source in {_identity(p) for p in o.parents}:
        where = "is inside"
    elif out_dir is not None and out_dir in {_identity(p) for p in m.parents}:
        where = "holds"
    else:
        return
    raise OutputExistsError(f"out (--out) {o} {where} the source checkpoint {m}; choose an --out outside it")


def _identity(path: Path) -> tuple[int, int] | None:
    """(device, inode) of an existing file or directory (Windows: volume and file index), else None."""
    try:
        st = path.stat()
    except OSError:
        return None
    return st.st_dev, st.st_ino


def _check_copied_files(config: SalaConfig, model_dir: Path | None) -> None:
    """The files the write copies from the model's directory (copied_files) can be read: a README
    without read permission fails now, not after the solve, with the write's own message."""
    try:
        with output.stderr.capture():       # its missing-auto_map warning is said once, by the write
            files = copied_files(config, model_dir)
        for f in files.values():
            with open(f, "rb"):
                pass
    except OSError as e:
        raise CheckpointError(f"cannot read {e.filename}, to copy into the checkpoint: {e.strerror or e}; "
                              "make it a readable file") from None


def _check_load_arguments(lm: LoadedModel, device: str, dtype: str, random_weights: bool) -> None:
    """A LoadedModel is quantized on its own device and dtype: load arguments that say otherwise
    would be silently ignored, so they are refused."""
    have_device, have_dtype = lm.model.device, lm.model.model.embed_tokens.weight.dtype
    wrong = []
    if device != "auto" and resolve_device(device).type != have_device.type:
        wrong.append(f"device {device!r} (the model is on {have_device})")
    if dtype != "auto" and resolve_dtype(dtype, have_device) != have_dtype:
        wrong.append(f"dtype {dtype!r} (the model is {str(have_dtype).removeprefix('torch.')})")
    if random_weights:
        wrong.append("random_weights")
    if wrong:
        raise UsageError(f"{', '.join(wrong)} apply only when quantize_checkpoint loads the model; a LoadedModel "
                         "is quantized as loaded (choose with load_model(..., device=, dtype=))")


def _calibration_plan(model_dir: Path | None, opts: QuantOptions, calib: str | Path | None,
                      tokenizer: str | Path | None, random_weights: bool) -> tuple[str | None, Tokenizer | None] | None:
    """What the calibration windows come from, checked without building them: (calib, tokenizer) as
    calibration_windows takes them (calib None: the built-in corpus), or None when none are needed."""
    calib = None if calib is None else str(calib)
    if not needs_calibration(opts, calib):
        output.stderr.print("note: RTN needs no calibration data; pass --calib FILE (or 'random') to also "
                            "report each module's output error")
        return None
    tok = None
    if calib != RANDOM:
        try:
            tok = find_tokenizer(tokenizer, model_dir)
        except Exception:
            if calib is not None or not random_weights or tokenizer is not None:
                raise
            calib = RANDOM          # random weights whose model has no tokenizer: random ids
            output.stderr.print("note: no tokenizer for random weights; calibrating on random token ids")
    return calib, tok


def _calibration_source(calib: str | None) -> str:
    """The record's calibration source: the --calib file as an absolute, resolved path (a relative
    one names nothing where the record is read), "random", or the built-in corpus."""
    if calib is None:
        return "builtin-corpus"
    return calib if calib == RANDOM else str(Path(calib).resolve())


def _calibration_windows(cfg: SalaConfig, model_dir: Path | None, calib: str | None, tok: Tokenizer | None,
                         nsamples: int, seqlen: int, seed: int) -> torch.Tensor:
    """The calibration windows [S, T] of _calibration_plan's (calib, tokenizer)."""
    output.warn_past_trained_length(seqlen, cfg.max_position_embeddings, "--seqlen")
    eos_id = next(iter(stop_token_ids(cfg, model_dir, tok)), None)     # config.json's eos may be null
    windows = calibration_windows(calib, tok, nsamples, seqlen, cfg.vocab_size, seed, eos_id=eos_id)
    if windows.shape[0] < nsamples:
        output.stderr.print(f"warning: the calibration text gives {windows.shape[0]} windows of "
                            f"{windows.shape[1]} tokens, fewer than --nsamples {nsamples}")
    return windows


def _calibration_fit(config: SalaConfig, opts: QuantOptions, windows: torch.Tensor | None) -> dict:
    """The record's widest_in_features and calibration_underdetermined (None without calibration).
    With fewer calibration tokens than a quantized linear's inputs its Hessian is rank-deficient:
    GPTQ can fit those few activations almost exactly, so the errors measured on them (the ones it
    fitted) say little about other text."""
    widest = widest_quantized_input(config, opts.group_size)
    return {"widest_in_features": widest,
            "calibration_underdetermined": None if windows is None else int(windows.numel()) < widest}


def _knobs(model: str | Path | LoadedModel, opts: QuantOptions, device: str, dtype: str, random_weights: bool,
           seed: int, nsamples: int, seqlen: int, windows: torch.Tensor | None, calib_source: str | None,
           tokenizer_file: str | None) -> dict:
    """What the result depends on beyond quantization_config's own keys, recorded and kept in the
    checkpoint's meta. Each is None where it could not change the result: without calibration no
    batch, windows or forward ran, so only random weights use the seed and only weights quantized
    from memory (random, or a LoadedModel's) the dtype. nsamples and seqlen are as asked; calibration
    says what the data gave; tokenizer is the given one's file (None: the model's own)."""
    calibrated = windows is not None
    from_memory = random_weights or isinstance(model, LoadedModel)
    return {"kv_scales_per_head": opts.kv_scales_per_head,
            "batch_tokens": opts.batch_tokens if calibrated else None,
            "seed": seed if calibrated or random_weights else None,
            "dtype": _dtype_name(_compute_dtype(model, device, dtype)) if calibrated or from_memory else None,
            "nsamples": nsamples if calibrated else None,
            "seqlen": seqlen if calibrated else None,
            "tokenizer": tokenizer_file,
            "calibration": None if not calibrated else {
                "source": calib_source, "samples": int(windows.shape[0]),
                "seqlen": int(windows.shape[1]), "tokens": int(windows.numel())}}


def _compute_dtype(model: str | Path | LoadedModel, device: str, dtype: str) -> torch.dtype:
    """The dtype the model is loaded in, which the calibration forwards run in."""
    if isinstance(model, LoadedModel):
        return model.model.model.embed_tokens.weight.dtype
    return resolve_dtype(dtype, resolve_device(device))


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _check_memory(model: str | Path | LoadedModel, config: SalaConfig, device: str, dtype: str,
                  shape: tuple[int, int] | None) -> None:
    """Before the weights load: the calibration activations (each layer's inputs and outputs, two
    [samples, seqlen, hidden] tensors in the forward dtype, for calibration windows of `shape`), the
    largest group's fp32 Hessian and the weights not loaded yet must fit the model's device (exit 11,
    naming the --nsamples that fits)."""
    from salactl.evaluation.perplexity import model_weight_bytes
    from salactl.units import human_bytes

    if shape is None:
        return
    act = _compute_dtype(model, device, dtype)
    if isinstance(model, LoadedModel):
        dev, weights = model.model.device, 0
    else:
        dev = resolve_device(device)
        weights = model_weight_bytes(config, None, act.itemsize)
    samples, seqlen = shape
    per_sample = 2 * seqlen * config.hidden_size * act.itemsize
    widest = max(config.hidden_size, config.intermediate_size, config.num_attention_heads * config.head_dim,
                 config.lightning_nh * config.lightning_head_dim)
    fixed = weights + widest * widest * 4
    room = available_bytes(dev)
    fits = max((room or 0) - fixed, 0) // per_sample
    fix = (f"use nsamples (--nsamples) {fits:,} or less, or a shorter seqlen (--seqlen)" if fits else
           "use a shorter seqlen (--seqlen), a smaller dtype (--dtype) or a machine with more memory")
    check_fits(fixed + samples * per_sample, room,
               f"quantize (the calibration activations, 2 x {samples:,} samples x {seqlen:,} tokens x "
               f"{config.hidden_size:,} in {_dtype_name(act)}: {human_bytes(samples * per_sample)}; "
               f"the widest fp32 Hessian and the weights: {human_bytes(fixed)})",
               "this machine" if dev.type == "cpu" else str(dev), fix)


def _counted(progress: ProgressCallback | None, config) -> Callable[[str], None] | None:
    """quantize_model's per-group label callback, reporting (done, total, label) to `progress`;
    announces (0, total) now. total counts every group, also those left wholly unquantized."""
    if progress is None:
        return None
    total = sum(len(layer_groups(config, i)) for i in range(config.num_hidden_layers))
    progress(0, total, "quantizing")
    done = 0

    def advance(label: str) -> None:
        nonlocal done
        done += 1
        progress(done, total, label)

    return advance


def _write(out: str | Path, lm: LoadedModel, opts: QuantOptions, result: QuantizeOutcome, overwrite: bool,
           source: StoredTensors | None, knobs: dict) -> None:
    fp8 = fp8_dtype(opts.kv_cache_dtype) is not None
    kv_json = sglang_scales_json(result.kv_scales, opts.kv_cache_dtype, lm.config) if fp8 else None
    qconfig = quantization_config(opts, result.skipped)
    qconfig["meta"].update(knobs)
    write_quantized_checkpoint(Path(out), lm.config, lm.model, result.quantized, qconfig, lm.model_dir,
                               result.kv_scales, kv_json, overwrite=overwrite, source=source)


def _record(out: str | Path, lm: LoadedModel, opts: QuantOptions, fit: dict, knobs: dict,
            result: QuantizeOutcome, seconds: dict, source_dir: Path | None) -> dict:
    # RTN against itself is no comparison
    better = [r for r in result.reports if r.error is not None and r.rtn_error is not None] \
        if opts.method != "rtn" else []
    return {
        "out": Path(out),                       # the file system's name; --json shows it as UTF-8 (jsonable)
        "model": input_files.model_record_name(lm.source),   # as eval's records name it
        "method": opts.method, "bits": opts.bits, "group_size": opts.group_size, "desc_act": opts.desc_act,
        "clip_search": opts.clip_search,
        "damp": opts.damp if opts.method == "gptq" else None, "kv_cache_dtype": opts.kv_cache_dtype,
        **knobs,
        **fit,
        "modules": [r.__dict__ for r in result.reports],
        "skipped": result.skipped,
        "damp_raised": result.damp_raised,
        "kv_scales": None if not result.kv_scales else {
            str(i): {"k": k.flatten().tolist(), "v": v.flatten().tolist()} for i, (k, v) in result.kv_scales.items()},
        "fraction_better_than_rtn": (sum(r.error < r.rtn_error for r in better) / len(better)) if better else None,
        "seconds": seconds,
        "checkpoint_bytes": {"source": _safetensors_bytes(source_dir), "written": _safetensors_bytes(Path(out))},
        "peak_gpu_gib": _peak_gpu_gib(lm.model.device),
        "env": environment(),
    }


def _safetensors_bytes(directory: Path | None) -> int | None:
    """The bytes of the safetensors files a checkpoint directory's weights load from (other
    *.safetensors beside them are not the checkpoint); None without a directory or where they cannot
    be told, as a record's detail is no reason to fail the command."""
    if directory is None or not Path(directory).is_dir():
        return None
    try:
        return sum(f.stat().st_size for f in set(tensor_files(Path(directory)).values()))
    except (SalactlError, OSError):
        return None


def _peak_gpu_gib(device: torch.device) -> float | None:
    """Peak torch-allocated memory on the quantizing GPU (None on CPU)."""
    if device.type != "cuda":
        return None
    return torch.cuda.max_memory_allocated(device) / 2**30

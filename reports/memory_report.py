"""`salactl report memory`: the tables of reports/memory.py for given contexts, KV dtypes, weight
dtypes and GPUs, the full-attention comparison, and measured peaks from run/bench records."""

from __future__ import annotations

from dataclasses import dataclass
from itertools import accumulate
from pathlib import Path
from typing import NamedTuple

from salactl.errors import SalactlError
from salactl.quant.in_memory import QUANTIZED_BITS
from salactl.reports.memory import (GB, KV_DTYPE_BYTES, full_attention_request, gpu_memory,
                                    kv_bytes_per_token, max_concurrent, paged_tokens,
                                    prefill_workspace_bytes, request_memory, server_memory, weight_bytes)
from salactl.reports.records import is_finite_number
from salactl.runtime.config import SalaConfig
from salactl.runtime.loader import planning_config, quantization_config

PEAK_KEYS = ("peak_memory_bytes", "peak_gpu_memory_bytes", "peak_memory_allocated_bytes",
             "max_memory_allocated_bytes", "max_memory_allocated")
CONTEXT_KNOBS = ("context", "context_len", "input_len", "random_input_len", "prompt_tokens")
OUTPUT_KNOBS = ("output_len", "random_output_len")    # generated per request, on top of the prompt
BATCH_KNOBS = ("batch", "batch_size")     # else max_concurrency (record_batch); `concurrency` is a metric
WEIGHT_KNOBS = ("weights", "weight_dtype")
KV_KNOBS = ("kv_cache_dtype", "kv_dtype")
# a model dtype's names -> the name its rows show (bytes per element: KV_DTYPE_BYTES, same names)
DTYPES = {"bf16": "bf16", "bfloat16": "bf16", "fp16": "fp16", "float16": "fp16", "fp32": "fp32",
          "float32": "fp32"}


class Gpu(NamedTuple):
    name: str
    bytes: int              # total memory
    source: str             # where `bytes` comes from: "nvidia-smi", "datasheet" or "--gpu-mem"


@dataclass(frozen=True)
class MemoryQuery:
    contexts: tuple[int, ...]
    kv_dtypes: tuple[str, ...] = ("bf16",)
    weights: tuple[str, ...] = ("bf16",)
    gpus: tuple[Gpu, ...] = ()
    mem_fraction: float = 0.9
    prefill_chunk: int = 8192
    max_batch: int = 32
    cuda_graphs: bool = True
    compressed_keys: str = "k1"
    group_size: int = 128


def build(config: SalaConfig, q: MemoryQuery, records: list[dict] | None = None,
          model: str | None = None) -> dict:
    """The report for `config` (the shapes of `model`, as --model names it); records of another
    model are predicted with their own model's shapes where it can be read, else not at all."""
    servers = {w: server_memory(config, w, q.prefill_chunk, q.max_batch, q.cuda_graphs, q.group_size)
               for w in q.weights}
    per_request = []
    for kv in q.kv_dtypes:
        for ctx in q.contexts:
            r = request_memory(config, ctx, kv, q.compressed_keys)
            per_request.append({"kv_dtype": kv, **r.to_dict(), "paged_tokens": paged_tokens(config, ctx),
                                "full_attention": full_attention_request(config, ctx, kv)})
    measured, unreadable = measured_rows(config, records or [], q, model)
    concurrency = []
    for gpu, gpu_bytes, source in q.gpus:
        for w, srv in servers.items():
            for row in per_request:
                sala = max_concurrent(gpu_bytes, q.mem_fraction, srv.fixed, row["total"])
                full = max_concurrent(gpu_bytes, q.mem_fraction, srv.fixed, row["full_attention"])
                concurrency.append({"gpu": gpu, "gpu_bytes": gpu_bytes, "gpu_bytes_source": source,
                                    "weights": w, "kv_dtype": row["kv_dtype"], "context": row["context"],
                                    "max_requests": sala, "max_requests_full_attention": full,
                                    "ratio": (sala / full) if full else None})
    return {
        "shape": {"layers": config.num_hidden_layers, "sparse_layers": len(config.sparse_layers),
                  "lightning_layers": len(config.lightning_layers),
                  "params": config.parameter_count()},
        "assumptions": {
            "mem_fraction": q.mem_fraction, "prefill_chunk": q.prefill_chunk,
            "max_batch_cuda_graphs": q.max_batch if q.cuda_graphs else 0,
            "compressed_keys_kept": q.compressed_keys,
            "compressed_keys_note": "our runtime keeps K1 only; SGLang keeps K1 and K2",
            "estimates": ["workspace_estimate", "cuda_graphs_estimate", "cuda_context_estimate"],
            "full_attention": "same weights, all layers GQA softmax (KV for every layer, no GLA state)",
            "paging": "both KV columns hold paged_tokens: the context rounded up to whole pages of "
                      f"{config.sparse_config.block_size} tokens, as the GPU engine allocates them",
            "gpu_bytes": "total memory: nvidia-smi's memory.total (MiB x 2^20) for a --gpu name, the "
                         "datasheet's GB x 10^9 where gpu_bytes_source says datasheet, --gpu-mem GB x 10^9",
        },
        "kv_bytes_per_token": {kv: kv_bytes_per_token(config, kv) for kv in q.kv_dtypes},
        "kv_bytes_per_token_full_attention": {
            kv: kv_bytes_per_token(config, kv, layers=config.num_hidden_layers) for kv in q.kv_dtypes},
        "server": {w: s.to_dict() for w, s in servers.items()},
        "per_request": per_request,
        "concurrency": concurrency,
        "weights_exceed_memory": weights_exceed_memory(servers, q),
        "fixed_exceeds_memory": fixed_exceeds_memory(servers, q),
        "measured": measured,
        "measured_models_unreadable": [{"model": m, "records": n} for m, n in unreadable.items()],
    }


def weights_exceed_memory(servers, q: MemoryQuery) -> list[dict]:
    """(GPU, weights) pairs whose weights alone exceed the usable memory (all their rows say 0)."""
    return [{"gpu": gpu, "weights": w, "weights_bytes": srv.weights.total,
             "usable_bytes": int(gpu_bytes * q.mem_fraction)}
            for gpu, gpu_bytes, _ in q.gpus for w, srv in servers.items()
            if srv.weights.total > gpu_bytes * q.mem_fraction]


def fixed_exceeds_memory(servers, q: MemoryQuery) -> list[dict]:
    """(GPU, weights) pairs whose fixed total exceeds the usable memory (all their rows say 0), with
    the part of weights + workspace + CUDA graphs + CUDA context whose addition exceeds it."""
    out = []
    for gpu, gpu_bytes, _ in q.gpus:
        for w, srv in servers.items():
            parts = {"weights": srv.weights.total, "workspace_estimate": srv.workspace,
                     "cuda_graphs_estimate": srv.cuda_graphs, "cuda_context_estimate": srv.cuda_context}
            part = next((p for p, total in zip(parts, accumulate(parts.values()))
                         if total > gpu_bytes * q.mem_fraction), None)
            if part is not None:
                out.append({"gpu": gpu, "weights": w, "exceeded_by": part, "fixed_bytes": srv.fixed,
                            "usable_bytes": int(gpu_bytes * q.mem_fraction)})
    return out


def record_settings(rec: dict) -> dict:
    """The settings that produced a record: its knobs, over bench's embedded-target settings
    (knobs.target: dtype, weights, kv_cache_dtype, chunk_size, max_running_requests, ...)."""
    knobs = rec.get("knobs") or {}
    target = knobs.get("target") if isinstance(knobs.get("target"), dict) else {}
    return {**target, **{k: v for k, v in knobs.items() if v is not None}}


MAX_SIZE_KNOB = 2**63       # a token count or batch past int64 is no setting that ran (a hand-edited record)


def _knob(rec: dict, settings: dict, names) -> int | None:
    """The first of `names` (in the settings, else the record) that is a positive finite number below
    MAX_SIZE_KNOB, as an int; None when none is."""
    for n in names:
        for src in (settings, rec):
            v = src.get(n)
            if is_finite_number(v) and 0 < v < MAX_SIZE_KNOB:
                return int(v)
    return None


def _text(settings: dict, names) -> str | None:
    """The first of `names` whose setting is a string (a hand-edited list or number is none)."""
    return next((settings[k] for k in names if isinstance(settings.get(k), str)), None)


def record_batch(rec: dict, settings: dict) -> int | None:
    """Requests in memory at once: the batch knob; a `run` is one request; else max_concurrency
    capped by the embedded engine's max_running_requests and the number of prompts. None (unknown,
    no prediction) when neither bounds it, as for an unlimited-concurrency phase over HTTP."""
    batch = _knob(rec, settings, BATCH_KNOBS)
    if batch or rec.get("kind") == "run":
        return batch or 1
    bounds = [n for n in (_knob(rec, settings, ("max_concurrency",)),
                          _knob(rec, settings, ("max_running_requests",))) if n]
    prompts = _knob(rec, settings, ("num_prompts",))
    return min(bounds + ([prompts] if prompts else [])) if bounds else None


def checkpoint_quantization(path: Path) -> dict | None:
    """A checkpoint's GPTQ settings ({bits, group_size, fmt, desc_act}) from its config.json or
    quantize_config.json, checked as loading checks them (parse_quant_config: a value loading refuses
    is the same CheckpointError); None for a float checkpoint. No weights read."""
    from salactl.quant.loading import parse_quant_config

    qc = quantization_config(path)
    return None if qc is None else parse_quant_config(qc)


def _checkpoint_quant(rec: dict, settings: dict) -> tuple[str | None, int | None]:
    """("w4a16"/"w8a16", GPTQ group) or ("", None) for unquantized weights, as the record's
    checkpoint says; (None, None) when it cannot be read or loading would refuse it."""
    if settings.get("random_weights") is True:
        return "", None                         # random weights are never quantized (runtime/loader.py)
    try:
        spec = checkpoint_quantization(Path(str(rec.get("model"))))
    except (OSError, ValueError, TypeError, SalactlError):
        return None, None
    return ("", None) if spec is None else (f"w{spec['bits']}a16", spec["group_size"])


def record_weights(rec: dict) -> tuple[str, int | None, int | None]:
    """(weights, activation bytes, GPTQ group) that produced a record: from its settings (weights /
    weight_dtype, dtype) or, for the embedded runtime, its checkpoint; ("unknown", None, None) when
    neither says (no guessing)."""
    settings = record_settings(rec)
    w = _text(settings, WEIGHT_KNOBS)
    group = None
    embedded = rec.get("kind") == "run" or rec.get("target") == "embedded"
    if embedded and (w is None or w in QUANTIZED_BITS):    # the group size is in the checkpoint
        found, group = _checkpoint_quant(rec, settings)
        w = w or found
    dtype = DTYPES.get(_text(settings, ("dtype",)))
    if w in QUANTIZED_BITS:                     # W4A16/W8A16: 16-bit unless the record says otherwise
        return w, KV_DTYPE_BYTES[dtype or "bf16"], group
    dtype = DTYPES.get(w) or (dtype if w in ("", "dense") else None)
    return (dtype, KV_DTYPE_BYTES[dtype], None) if dtype else ("unknown", None, None)


def record_model(rec: dict) -> str | None:
    """The model a record names: a checkpoint directory, a preset (random weights are written
    "random:<name>:seed=N"), or an HTTP server's model name."""
    name = rec.get("model")
    if not isinstance(name, str) or not name:
        return None
    if name.startswith("random:"):
        name = name.removeprefix("random:").rsplit(":seed=", 1)[0]
    return name


def readable_config(name: str) -> SalaConfig | None:
    """A record's model's shapes: its preset or checkpoint config.json (no weights read); None when
    it cannot be read here (an HTTP server's model name, a checkpoint on another machine)."""
    try:
        return planning_config(name)
    except (SalactlError, OSError, ValueError):
        return None


@dataclass(frozen=True)
class RecordShape:
    """What a record's peak depends on, as the record says it (None or "unknown": not said)."""
    context: int | None             # prompt + generated tokens of a request
    prompt: int | None
    batch: int | None
    weights: str
    act_bytes: int | None
    group: int | None
    kv_dtype: str
    chunk: int | None               # the prefill chunk setting
    cache_pool: int | None          # the GPU engine's reserved cache pools (cache_pool_bytes)


def record_shape(rec: dict) -> RecordShape:
    settings = record_settings(rec)
    ctx, prompt = record_context(rec, settings)
    pool = rec.get("cache_pool_bytes")
    return RecordShape(ctx, prompt, record_batch(rec, settings), *record_weights(rec),
                       _text(settings, KV_KNOBS) or "unknown", _knob(rec, settings, ("chunk_size",)),
                       pool if is_finite_number(pool) and pool > 0 else None)


def predicted_peak(config: SalaConfig, s: RecordShape, q: MemoryQuery) -> tuple[int | None, str | None]:
    """(prediction, what it adds to weights + workspace: "cache_pool" or "per_request"), or (None,
    None) where the record does not say enough. A recorded cache pool is what the GPU engine
    reserved from the free memory, whatever the requests needed: the requests' own memory would
    compare the peak with a fraction of what it holds."""
    if not s.act_bytes:
        return None, None
    chunk = s.chunk or q.prefill_chunk
    weights = weight_bytes(config, s.weights if s.weights in QUANTIZED_BITS else "bf16",
                           s.group or q.group_size, s.act_bytes).total
    if s.cache_pool:        # the GPU engine's prefill step packs the prompts of all its requests
        tokens = min(chunk, s.prompt * s.batch) if s.prompt and s.batch else chunk
        return weights + prefill_workspace_bytes(config, tokens, s.act_bytes) + s.cache_pool, "cache_pool"
    if not (s.context and s.batch and s.kv_dtype in KV_DTYPE_BYTES):
        return None, None
    request = request_memory(config, s.context, s.kv_dtype, q.compressed_keys, s.act_bytes).total
    workspace = prefill_workspace_bytes(config, min(chunk, s.prompt or s.context), s.act_bytes)
    return weights + workspace + s.batch * request, "per_request"


def measured_rows(config, records, q: MemoryQuery, model: str | None = None) -> tuple[list[dict], dict]:
    """Measured allocator peaks next to the analytic prediction for the record's model, context,
    batch, weights, dtype and prefill chunk (predicted_peak; the CUDA context is not seen by the
    allocator and not included). The context is the prompt plus the generated tokens (a peak is
    the whole request's). Also returns {model: records} of the models that could not be read, None
    for records that name no model (their rows have no prediction)."""
    rows, unreadable = [], {}
    configs = {model: config}     # records of --model's model; one naming none has no prediction
    for rec in records:
        peak = next((rec[k] for k in PEAK_KEYS if is_finite_number(rec.get(k)) and rec[k] > 0), None)
        if peak is None:
            continue
        name = record_model(rec)
        if name is not None and name not in configs:
            configs[name] = readable_config(name)
        rec_config = configs.get(name)
        if rec_config is None:              # None: the records that name no model
            unreadable[name] = unreadable.get(name, 0) + 1
        s = record_shape(rec)
        predicted, predicted_with = predicted_peak(rec_config, s, q) if rec_config else (None, None)
        rows.append({"label": rec.get("label") or rec.get("run_id"), "phase": rec.get("phase"),
                     "model": rec.get("model"), "context": s.context, "batch": s.batch, "weights": s.weights,
                     "kv_dtype": s.kv_dtype, "measured_peak": peak, "cache_pool_bytes": s.cache_pool,
                     "predicted": predicted, "predicted_with": predicted_with,
                     "ratio": (peak / predicted) if predicted else None})
    return rows, unreadable


def record_context(rec: dict, settings: dict) -> tuple[int | None, int | None]:
    """(context, prompt) tokens of a record's requests: the input and output length knobs, else a
    `run` record's token totals; None where neither says."""
    ctx = prompt = _knob(rec, settings, CONTEXT_KNOBS)
    if ctx is not None:
        return ctx + (_knob(rec, settings, OUTPUT_KNOBS) or 0), prompt
    n_in, n_out = rec.get("total_input_tokens"), rec.get("total_output_tokens")
    if rec.get("kind") == "run" and all(isinstance(n, int) and 0 <= n < MAX_SIZE_KNOB
                                        for n in (n_in, n_out)):
        return n_in + n_out, n_in
    return None, None


def gpu_list(names: list[str] | None, gpu_mem_gb: float | None) -> tuple[Gpu, ...]:
    """One GPU of gpu_mem_gb GB (10^9 bytes) when given (names unused, may be None), else each
    named GPU (the CLI's default list: cmd_report.DEFAULT_GPUS) with its total memory."""
    if gpu_mem_gb is None and names is None:
        raise ValueError("gpu_list needs GPU names or gpu_mem_gb")
    if gpu_mem_gb is not None:
        return (Gpu(f"{gpu_mem_gb:g} GB", int(gpu_mem_gb * GB), "--gpu-mem"),)
    return tuple(Gpu(n, *gpu_memory(n)) for n in names)

"""`salactl report memory`: the tables of reports/memory.py for given contexts, KV dtypes, weight
dtypes and GPUs, the full-attention comparison, and measured peaks from run/bench records."""

from __future__ import annotations

from dataclasses import dataclass
from itertools import accumulate
from pathlib import Path

from salactl.errors import SalactlError
from salactl.quant.in_memory import QUANTIZED_BITS
from salactl.reports.memory import (KV_DTYPE_BYTES, full_attention_request, gpu_memory_bytes,
                                    kv_bytes_per_token, max_concurrent, prefill_workspace_bytes,
                                    request_memory, server_memory, weight_bytes)
from salactl.runtime.config import SalaConfig
from salactl.runtime.loader import quantization_config

PEAK_KEYS = ("peak_memory_bytes", "peak_gpu_memory_bytes", "peak_memory_allocated_bytes",
             "max_memory_allocated_bytes", "max_memory_allocated")
CONTEXT_KNOBS = ("context", "context_len", "input_len", "random_input_len", "prompt_tokens")
OUTPUT_KNOBS = ("output_len", "random_output_len")    # generated per request, on top of the prompt
BATCH_KNOBS = ("batch", "batch_size", "max_concurrency", "concurrency")
WEIGHT_KNOBS = ("weights", "weight_dtype")
# a model dtype's names -> the name its rows show (bytes per element: KV_DTYPE_BYTES, same names)
DTYPES = {"bf16": "bf16", "bfloat16": "bf16", "fp16": "fp16", "float16": "fp16", "fp32": "fp32",
          "float32": "fp32"}


@dataclass(frozen=True)
class MemoryQuery:
    contexts: tuple[int, ...]
    kv_dtypes: tuple[str, ...] = ("bf16",)
    weights: tuple[str, ...] = ("bf16",)
    gpus: tuple[tuple[str, int], ...] = ()       # (name, bytes)
    mem_fraction: float = 0.9
    prefill_chunk: int = 8192
    max_batch: int = 32
    cuda_graphs: bool = True
    compressed_keys: str = "k1"
    group_size: int = 128


def build(config: SalaConfig, q: MemoryQuery, records: list[dict] | None = None) -> dict:
    servers = {w: server_memory(config, w, q.prefill_chunk, q.max_batch, q.cuda_graphs, q.group_size)
               for w in q.weights}
    per_request = []
    for kv in q.kv_dtypes:
        for ctx in q.contexts:
            r = request_memory(config, ctx, kv, q.compressed_keys)
            per_request.append({"kv_dtype": kv, **r.to_dict(),
                                "full_attention": full_attention_request(config, ctx, kv)})
    concurrency = []
    for gpu, gpu_bytes in q.gpus:
        for w, srv in servers.items():
            for row in per_request:
                sala = max_concurrent(gpu_bytes, q.mem_fraction, srv.fixed, row["total"])
                full = max_concurrent(gpu_bytes, q.mem_fraction, srv.fixed, row["full_attention"])
                concurrency.append({"gpu": gpu, "gpu_bytes": gpu_bytes, "weights": w,
                                    "kv_dtype": row["kv_dtype"], "context": row["context"],
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
        },
        "kv_bytes_per_token": {kv: kv_bytes_per_token(config, kv) for kv in q.kv_dtypes},
        "kv_bytes_per_token_full_attention": {
            kv: kv_bytes_per_token(config, kv, layers=config.num_hidden_layers) for kv in q.kv_dtypes},
        "server": {w: s.to_dict() for w, s in servers.items()},
        "per_request": per_request,
        "concurrency": concurrency,
        "weights_exceed_memory": weights_exceed_memory(servers, q),
        "fixed_exceeds_memory": fixed_exceeds_memory(servers, q),
        "measured": measured_rows(config, records or [], q),
    }


def weights_exceed_memory(servers, q: MemoryQuery) -> list[dict]:
    """(GPU, weights) pairs whose weights alone exceed the usable memory (all their rows say 0)."""
    return [{"gpu": gpu, "weights": w, "weights_bytes": srv.weights.total,
             "usable_bytes": int(gpu_bytes * q.mem_fraction)}
            for gpu, gpu_bytes in q.gpus for w, srv in servers.items()
            if srv.weights.total > gpu_bytes * q.mem_fraction]


def fixed_exceeds_memory(servers, q: MemoryQuery) -> list[dict]:
    """(GPU, weights) pairs whose fixed total exceeds the usable memory (all their rows say 0), with
    the part of weights + workspace + CUDA graphs + CUDA context whose addition exceeds it."""
    out = []
    for gpu, gpu_bytes in q.gpus:
        for w, srv in servers.items():
            parts = {"weights": srv.weights.total, "workspace_estimate": srv.workspace,
                     "cuda_graphs_estimate": srv.cuda_graphs, "cuda_context_estimate": srv.cuda_context}
            part = next((p for p, total in zip(parts, accumulate(parts.values()))
                         if total > gpu_bytes * q.mem_fraction), None)
            if part is not None:
                out.append({"gpu": gpu, "weights": w, "exceeded_by": part, "fixed_bytes": srv.fixed,
                            "usable_bytes": int(gpu_bytes * q.mem_fraction)})
    return out


def _knob(rec: dict, names) -> int | None:
    knobs = rec.get("knobs") or {}
    for n in names:
        for src in (knobs, rec):
            v = src.get(n)
            if isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0:
                return int(v)
    return None


def _checkpoint_quant(rec: dict) -> tuple[str | None, int | None]:
    """("w4a16"/"w8a16", GPTQ group) or ("", None) for unquantized weights, as the `run` record's
    checkpoint (its config.json's quantization_config) says; (None, None) when it cannot be read."""
    if (rec.get("knobs") or {}).get("random_weights") is True:
        return "", None                         # random weights are never quantized (runtime/loader.py)
    try:
        qc = quantization_config(Path(str(rec.get("model"))))
        if not qc:
            return "", None
        w = f"w{qc['bits']}a16"
        return (w, qc.get("group_size", -1)) if w in QUANTIZED_BITS else (None, None)
    except (OSError, ValueError, TypeError, KeyError, AttributeError, SalactlError):
        return None, None


def record_weights(rec: dict) -> tuple[str, int | None, int | None]:
    """(weights, activation bytes, GPTQ group) that produced a record: from its knobs (weights /
    weight_dtype, dtype) or, for `run` records, its checkpoint; ("unknown", None, None) when
    neither says (no guessing)."""
    knobs = rec.get("knobs") or {}
    w = next((knobs[k] for k in WEIGHT_KNOBS if isinstance(knobs.get(k), str)), None)
    group = None
    if rec.get("kind") == "run" and (w is None or w in QUANTIZED_BITS):    # the group size is in the checkpoint
        found, group = _checkpoint_quant(rec)
        w = w or found
    dtype = DTYPES.get(knobs.get("dtype"))
    if w in QUANTIZED_BITS:                     # W4A16/W8A16: 16-bit unless the record says otherwise
        return w, KV_DTYPE_BYTES[dtype or "bf16"], group
    dtype = DTYPES.get(w) or (dtype if w in ("", "dense") else None)
    return (dtype, KV_DTYPE_BYTES[dtype], None) if dtype else ("unknown", None, None)


def measured_rows(config, records, q: MemoryQuery) -> list[dict]:
    """Measured allocator peaks next to the analytic prediction for the record's context, batch,
    weights, dtype and prefill chunk (prediction = weights + workspace + batch × per-request; the
    CUDA context is not seen by the allocator and not included). The context is the prompt plus the
    generated tokens (a peak is the whole request's): a `run` record's token totals, else the
    input and output length knobs."""
    rows = []
    for rec in records:
        peak = next((rec[k] for k in PEAK_KEYS if isinstance(rec.get(k), (int, float))), None)
        if peak is None:
            continue
        knobs = rec.get("knobs") or {}
        ctx = prompt = _knob(rec, CONTEXT_KNOBS)
        if ctx is not None:
            ctx += _knob(rec, OUTPUT_KNOBS) or 0
        n_in, n_out = rec.get("total_input_tokens"), rec.get("total_output_tokens")
        if ctx is None and rec.get("kind") == "run" and all(isinstance(n, int) for n in (n_in, n_out)):
            ctx, prompt = n_in + n_out, n_in
        batch = _knob(rec, BATCH_KNOBS) or 1
        weights, act_bytes, group = record_weights(rec)
        kv = knobs.get("kv_cache_dtype") or knobs.get("kv_dtype") or "bf16"
        predicted = None
        if ctx and act_bytes and kv in KV_DTYPE_BYTES:
            chunk = min(_knob(rec, ("chunk_size",)) or q.prefill_chunk, prompt or ctx)
            predicted = (weight_bytes(config, weights if weights in QUANTIZED_BITS else "bf16",
                                      group or q.group_size, act_bytes).total
                         + prefill_workspace_bytes(config, chunk, act_bytes)
                         + batch * request_memory(config, ctx, kv, q.compressed_keys, act_bytes).total)
        rows.append({"label": rec.get("label") or rec.get("run_id"), "phase": rec.get("phase"),
                     "context": ctx, "batch": batch, "weights": weights, "kv_dtype": kv,
                     "measured_peak": peak, "predicted": predicted,
                     "ratio": (peak / predicted) if predicted else None})
    return rows


def gpu_list(names: list[str] | None, gpu_mem_gb: float | None) -> tuple[tuple[str, int], ...]:
    """(name, bytes) of one GPU of gpu_mem_gb GB when given (names unused, may be None), else of
    each named GPU (the CLI's default list: cmd_report.DEFAULT_GPUS)."""
    if gpu_mem_gb is None and names is None:
        raise ValueError("gpu_list needs GPU names or gpu_mem_gb")
    if gpu_mem_gb is not None:
        return ((f"{gpu_mem_gb:g} GB", int(gpu_mem_gb * 1e9)),)
    return tuple((n, gpu_memory_bytes(n)) for n in names)

"""`salactl report memory`: the tables of reports/memory.py for given contexts, KV dtypes, weight
dtypes and GPUs, the full-attention comparison, and measured peaks from run/bench records."""

from __future__ import annotations

from dataclasses import dataclass

from salactl.reports.memory import (full_attention_request, gpu_memory_bytes, kv_bytes_per_token,
                                    max_concurrent, request_memory, server_memory)
from salactl.runtime.config import SalaConfig

PEAK_KEYS = ("peak_memory_bytes", "peak_memory_allocated_bytes", "max_memory_allocated_bytes",
             "max_memory_allocated")
CONTEXT_KNOBS = ("context", "context_len", "input_len", "random_input_len", "prompt_tokens")
BATCH_KNOBS = ("batch", "batch_size", "max_concurrency", "concurrency")


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
        "measured": measured_rows(config, records or [], servers, q),
    }


def weights_exceed_memory(servers, q: MemoryQuery) -> list[dict]:
    """(GPU, weights) pairs whose weights alone exceed the usable memory (all their rows say 0)."""
    return [{"gpu": gpu, "weights": w, "weights_bytes": srv.weights.total,
             "usable_bytes": int(gpu_bytes * q.mem_fraction)}
            for gpu, gpu_bytes in q.gpus for w, srv in servers.items()
            if srv.weights.total > gpu_bytes * q.mem_fraction]


def _knob(rec: dict, names) -> int | None:
    knobs = rec.get("knobs") or {}
    for n in names:
        for src in (knobs, rec):
            v = src.get(n)
            if isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0:
                return int(v)
    return None


def measured_rows(config, records, servers, q: MemoryQuery) -> list[dict]:
    """Measured allocator peaks next to the analytic prediction for the record's context and
    batch (prediction = weights + workspace + batch × per-request; the CUDA context is not seen by
    the allocator and not included)."""
    rows = []
    for rec in records:
        peak = next((rec[k] for k in PEAK_KEYS if isinstance(rec.get(k), (int, float))), None)
        if peak is None:
            continue
        ctx, batch = _knob(rec, CONTEXT_KNOBS), _knob(rec, BATCH_KNOBS) or 1
        weights = (rec.get("knobs") or {}).get("weights", "bf16")
        kv = (rec.get("knobs") or {}).get("kv_cache_dtype", "bf16")
        predicted = None
        if ctx is not None and weights in servers:
            srv = servers[weights]
            predicted = (srv.weights.total + srv.workspace
                         + batch * request_memory(config, ctx, kv, q.compressed_keys).total)
        rows.append({"label": rec.get("label") or rec.get("run_id"), "phase": rec.get("phase"),
                     "context": ctx, "batch": batch, "weights": weights, "kv_dtype": kv,
                     "measured_peak": peak, "predicted": predicted,
                     "ratio": (peak / predicted) if predicted else None})
    return rows


def gpu_list(names: list[str] | None, gpu_mem_gb: float | None) -> tuple[tuple[str, int], ...]:
    if gpu_mem_gb is not None:
        return ((f"{gpu_mem_gb:g} GB", int(gpu_mem_gb * 1e9)),)
    names = names or ["H200", "H100", "A100-SXM4-80GB", "RTX PRO 6000", "L40S", "RTX 5090"]
    return tuple((n, gpu_memory_bytes(n)) for n in names)

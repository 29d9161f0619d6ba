"""Result records (one flat JSON object per line and (run, phase)), as `salactl bench`, `sweep`
and `run` write them: {"schema_version": 1, "kind", "run_id", "label", "profile", "phase",
"target", "model", <metric fields with SGLang names>, "knobs": {...}, "env": {...}}.

Reports are rendered from these records and never recompute metrics from raw data."""

from __future__ import annotations

import json
from pathlib import Path

from salactl.errors import UsageError

SCHEMA_VERSION = 1
KINDS = ("bench", "sweep", "run")
IDENTITY = ("kind", "run_id", "label", "profile", "phase", "target", "model")

# Known metric columns, in display order (SGLang bench_serving names, plus `run` fields).
METRICS = (
    "duration", "completed", "failed", "total_input_tokens", "total_output_tokens",
    "request_throughput", "input_throughput", "output_throughput", "total_throughput",
    "mean_ttft_ms", "median_ttft_ms", "p90_ttft_ms", "p95_ttft_ms", "p99_ttft_ms", "std_ttft_ms",
    "mean_tpot_ms", "median_tpot_ms", "p90_tpot_ms", "p99_tpot_ms", "std_tpot_ms",
    "mean_itl_ms", "median_itl_ms", "p90_itl_ms", "p95_itl_ms", "p99_itl_ms", "max_itl_ms", "std_itl_ms",
    "mean_e2e_latency_ms", "median_e2e_latency_ms", "p90_e2e_latency_ms", "p95_e2e_latency_ms",
    "p99_e2e_latency_ms", "std_e2e_latency_ms",
    "concurrency", "max_concurrent_requests", "max_output_tokens_per_s", "request_goodput",
    "prefill_latency", "prefill_throughput", "median_decode_latency", "median_decode_throughput",
    "total_latency", "overall_throughput",
    "ttft_s", "prefill_tok_s", "decode_tok_s", "tok_s", "peak_memory_bytes",
    "floor_s", "time_over_floor",       # `run`: the phase's roofline floor, its time / floor
)
UNITS = {"duration": "s", "request_throughput": "req/s", "input_throughput": "tok/s",
         "output_throughput": "tok/s", "total_throughput": "tok/s", "ttft_s": "s",
         "max_output_tokens_per_s": "tok/s", "prefill_latency": "s", "prefill_throughput": "tok/s",
         "median_decode_latency": "s", "median_decode_throughput": "tok/s", "total_latency": "s",
         "overall_throughput": "tok/s",
         "prefill_tok_s": "tok/s", "decode_tok_s": "tok/s", "tok_s": "tok/s",
         "request_goodput": "req/s", "peak_memory_bytes": "B", "floor_s": "s"}


def unit(metric: str) -> str:
    if metric.endswith("_ms"):
        return "ms"
    return UNITS.get(metric, "")


def load_records(paths: list[Path]) -> list[dict]:
    """Read and validate every record; bad input is a one-line UsageError naming file:line."""
    if not paths:
        raise UsageError("give at least one records file (JSON lines from bench, sweep or run)")
    records: list[dict] = []
    for path in paths:
        try:
            text = Path(path).read_text()
        except FileNotFoundError:
            raise UsageError(f"records file {path} does not exist") from None
        except OSError as e:
            raise UsageError(f"cannot read records file {path}: {e.strerror}") from None
        for lineno, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as e:
                raise UsageError(f"{path}:{lineno} is not valid JSON ({e.msg}); each line must be "
                                 "one record object") from None
            records.append(validate(rec, f"{path}:{lineno}"))
    if not records:
        raise UsageError(f"no records in {', '.join(str(p) for p in paths)}")
    return records


def validate(rec, where: str) -> dict:
    if not isinstance(rec, dict):
        raise UsageError(f"{where} is not a JSON object")
    version = rec.get("schema_version")
    if version != SCHEMA_VERSION:
        raise UsageError(f"{where} has schema_version {version!r}; this salactl reads version "
                         f"{SCHEMA_VERSION}")
    if rec.get("kind") not in KINDS:
        raise UsageError(f"{where} has kind {rec.get('kind')!r}; valid: {', '.join(KINDS)}")
    for key in ("knobs", "env"):
        if key in rec and not isinstance(rec[key], dict):
            raise UsageError(f"{where}: {key!r} must be an object")
    return rec


def label_of(rec: dict) -> str:
    return str(rec.get("label") or rec.get("run_id") or "unlabelled")


def group_by_label(records: list[dict]) -> dict[str, list[dict]]:
    groups: dict[str, list[dict]] = {}
    for r in records:
        groups.setdefault(label_of(r), []).append(r)
    return groups


def present_metrics(records: list[dict]) -> list[str]:
    """Known metric columns that at least one record carries as a number, in display order."""
    return [m for m in METRICS if any(_is_number(r.get(m)) for r in records)]


def _is_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)

"""Result records (one flat JSON object per line and (run, phase)), as `salactl bench`, `sweep`
and `run` write them: {"schema_version": 1, "kind", "run_id", "label", "profile", "phase",
"target", "model", <metric fields with SGLang names>, "knobs": {...}, "env": {...}}.

Reports are rendered from these records and never recompute metrics from raw data."""

from __future__ import annotations

import json
import math
from pathlib import Path

from salactl.errors import DatasetError, UsageError
from salactl.output import warn_once

SCHEMA_VERSION = 1
RECORDS_NAME = "records.jsonl"       # what run, bench and sweep --out DIR append to
KINDS = ("bench", "sweep", "run")
IDENTITY = ("kind", "run_id", "label", "profile", "phase", "target", "model")

# Known metric columns, in display order (SGLang bench_serving names, plus `run` fields).
METRICS = (
    "duration", "completed", "failed", "total_input_tokens", "total_output_tokens",
    "request_throughput", "input_throughput", "output_throughput", "total_throughput",
    "mean_ttft_ms", "median_ttft_ms", "p90_ttft_ms", "p95_ttft_ms", "p99_ttft_ms", "std_ttft_ms",
    "mean_tpot_ms", "median_tpot_ms", "p90_tpot_ms", "p95_tpot_ms", "p99_tpot_ms", "std_tpot_ms",
    "mean_itl_ms", "median_itl_ms", "p90_itl_ms", "p95_itl_ms", "p99_itl_ms", "max_itl_ms", "std_itl_ms",
    "mean_e2e_latency_ms", "median_e2e_latency_ms", "p90_e2e_latency_ms", "p95_e2e_latency_ms",
    "p99_e2e_latency_ms", "std_e2e_latency_ms",
    "concurrency", "max_concurrent_requests", "max_output_tokens_per_s", "request_goodput",
    "short_outputs", "output_len_estimated",     # bench: short / client-counted outputs
    "prefill_latency", "prefill_throughput", "median_decode_latency", "median_decode_throughput",
    "total_latency", "overall_throughput",
    "ttft_s", "prefill_tok_s", "decode_tok_s", "tok_s", "peak_memory_bytes",
    "floor_s", "time_over_floor",       # `run`: the phase's roofline floor, its time / floor
    # bench on CUDA (embedded target's phase_end): allocator peak and NVML energy
    "peak_gpu_memory_bytes", "energy_j", "mean_power_w", "energy_per_output_token_j",
    # sweep (salactl/bench/sweep_job.py): the point's cache per request and its accuracy proxies
    "cache_bytes_per_request", "logit_kl_mean", "logit_kl_sparse_mean", "logit_kl_max", "top1_agreement",
    "passkey_accuracy", "kl_positions", "kl_sparse_positions",
)
UNITS = {"duration": "s", "request_throughput": "req/s", "input_throughput": "tok/s",
         "output_throughput": "tok/s", "total_throughput": "tok/s", "ttft_s": "s",
         "max_output_tokens_per_s": "tok/s", "prefill_latency": "s", "prefill_throughput": "tok/s",
         "median_decode_latency": "s", "median_decode_throughput": "tok/s", "total_latency": "s",
         "overall_throughput": "tok/s",
         "prefill_tok_s": "tok/s", "decode_tok_s": "tok/s", "tok_s": "tok/s",
         "request_goodput": "req/s", "peak_memory_bytes": "B", "floor_s": "s",
         "peak_gpu_memory_bytes": "B", "energy_j": "J", "mean_power_w": "W",
         "energy_per_output_token_j": "J", "cache_bytes_per_request": "B"}


def unit(metric: str) -> str:
    if metric.endswith("_ms"):
        return "ms"
    return UNITS.get(metric, "")


def decode_records(data: bytes, path, fix: str = "") -> str:
    """A records file's bytes as text; not UTF-8 is a UsageError naming the file and line."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        lineno = data.count(b"\n", 0, e.start) + 1
        raise UsageError(f"{path}:{lineno} is not UTF-8 text (byte {e.start}); records files are JSON lines "
                         f"written by bench, sweep or run{fix}") from None


def load_records(paths: list[Path]) -> list[dict]:
    """Read and validate every record; bad input is a one-line UsageError naming file:line, a file
    that is missing or unreadable a DatasetError (exit 7, as other input files).

    A known metric that is present but not a finite number (a string, NaN, Infinity) is dropped
    from its record with a warning; a record left without any usable metric is skipped with a
    warning naming file:line, and an error when no record has one. A line that is not JSON (half a
    record, cut short by a full disk or a crash) is skipped with one warning per file; a file
    without records, or whose first line is not JSON (another kind of file, such as a JSON document
    spread over lines), is an error."""
    if not paths:
        raise UsageError("give at least one records file (JSON lines from bench, sweep or run)")
    records: list[dict] = []
    invalid: list[str] = []          # "file:line (metric, ...)": bad values dropped
    unusable: list[str] = []         # "file:line": records without any usable metric
    damaged: dict[str, list[tuple[int, str]]] = {}     # file: (line, why) of each line that is not JSON
    for path in paths:
        try:
            data = Path(path).read_bytes()
        except FileNotFoundError:
            raise DatasetError(f"records file {path} does not exist") from None
        except IsADirectoryError:
            inside = Path(path) / RECORDS_NAME
            fix = f"give {inside}" if inside.is_file() else "give a JSON lines file from bench, sweep or run"
            raise UsageError(f"records file {path} is a directory; {fix}") from None
        except OSError as e:
            raise DatasetError(f"cannot read records file {path}: {e.strerror}") from None
        text = decode_records(data, path)
        lines = [(lineno, line) for lineno, line in enumerate(text.splitlines(), 1) if line.strip()]
        if not lines:
            raise UsageError(f"no records in {path}; records files are the {RECORDS_NAME} that bench, sweep "
                             "or run --out DIR append to")
        for lineno, line in lines:
            where = f"{path}:{lineno}"
            try:
                rec = json.loads(line)
            except (json.JSONDecodeError, RecursionError) as e:
                why = e.msg if isinstance(e, json.JSONDecodeError) else "nested too deeply"
                if lineno == lines[0][0]:
                    raise _not_json_lines(path, text, where, why) from None
                damaged.setdefault(str(path), []).append((lineno, why))
                continue
            rec = validate(rec, where)
            bad = [m for m in METRICS if rec.get(m) is not None and not _is_number(rec[m])]
            if bad:
                rec = {k: (None if k in bad else v) for k, v in rec.items()}
            if not any(_is_number(rec.get(m)) for m in METRICS):
                unusable.append(f"{where} ({', '.join(bad)} not a finite number)" if bad else where)
                continue
            if bad:
                invalid.append(f"{where} ({', '.join(bad)})")
            records.append(rec)
    if not records:         # every file has a record: each was skipped as unusable
        raise UsageError(f"no record has a known metric as a finite number ({first_items(unusable)}); "
                         "records come from bench, sweep or run")
    for path, lines in damaged.items():
        warn_once(f"skipped {len(lines)} damaged line(s) of {path} (first: line {lines[0][0]})")
    if invalid:
        warn_once(f"dropped metric values that are not finite numbers: {first_items(invalid)}")
    if unusable:
        warn_once(f"skipped {len(unusable)} record(s) without any known metric as a finite number: "
              f"{first_items(unusable)}")
    return records


def _not_json_lines(path, text: str, where: str, why: str) -> UsageError:
    """The error for a records file whose first line is not JSON: one JSON document spread over
    lines (a --json output) is named as such."""
    try:
        json.loads(text)
    except (json.JSONDecodeError, RecursionError):
        return UsageError(f"{where} is not valid JSON ({why}); each line must be one record object")
    return UsageError(f"{path} is a JSON document, not JSON lines (one record object per line); give the "
                      f"{RECORDS_NAME} that bench, sweep or run --out DIR append to")


def first_items(items: list[str], n: int = 5) -> str:
    more = f" and {len(items) - n} more" if len(items) > n else ""
    return ", ".join(items[:n]) + more


def validate(rec, where: str) -> dict:
    if not isinstance(rec, dict):
        raise UsageError(f"{where} is not a JSON object")
    version = rec.get("schema_version")
    if version is None:
        raise UsageError(f"{where} is not a salactl record (no schema_version); records come from "
                         "bench, sweep or run --out")
    if version != SCHEMA_VERSION:
        raise UsageError(f"{where} has schema_version {version!r}; this salactl reads version "
                         f"{SCHEMA_VERSION}")
    if rec.get("kind") not in KINDS:
        raise UsageError(f"{where} has kind {rec.get('kind')!r}; valid: {', '.join(KINDS)}")
    for key in ("knobs", "env"):
        if key in rec and not isinstance(rec[key], dict):
            raise UsageError(f"{where}: {key!r} must be an object")
    phase = rec.get("phase")
    if not isinstance(phase, str) or not phase:
        got = "missing" if "phase" not in rec else f"got {json.dumps(phase)[:40]}"
        raise UsageError(f"{where}: 'phase' must be the phase's name, a non-empty string ({got}); "
                         "records come from bench, sweep or run")
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
    """A finite int or float (not a bool, NaN or infinity)."""
    if isinstance(v, bool):
        return False
    return isinstance(v, int) or (isinstance(v, float) and math.isfinite(v))

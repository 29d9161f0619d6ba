"""Result records (one flat JSON object per line and (run, phase)), as `salactl bench`, `sweep`
and `run` write them: {"schema_version": 1, "kind", "run_id", "label", "profile", "phase",
"target", "model", <metric fields with SGLang names>, "knobs": {...}, "env": {...}}.

Reports are rendered from these records and never recompute metrics from raw data."""

from __future__ import annotations

import itertools
import json
import math
import os
import stat
import unicodedata
from collections.abc import Iterator
from pathlib import Path

from salactl.errors import DatasetError, SalactlError, UsageError
from salactl.input_files import jsonl_byte_lines
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
    # bench on CUDA (embedded target's phase_end): allocator peak, the GPU engine's reserved cache
    # pools (most of that peak: sized from the free memory) and NVML energy
    "peak_gpu_memory_bytes", "cache_pool_bytes", "energy_j", "mean_power_w", "energy_per_output_token_j",
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
         "peak_gpu_memory_bytes": "B", "cache_pool_bytes": "B", "energy_j": "J", "mean_power_w": "W",
         "energy_per_output_token_j": "J", "cache_bytes_per_request": "B"}


def unit(metric: str) -> str:
    if metric.endswith("_ms"):
        return "ms"
    return UNITS.get(metric, "")


def breaks_lines(c: str) -> bool:
    """A control character or line/paragraph separator: one in a label or phase name splits the
    report's Markdown headings and table rows."""
    return unicodedata.category(c) in ("Cc", "Zl", "Zp")


MAX_RECORD_LINE = 64 * 2**20      # a record is kilobytes: a longer line is no record (a file of zeros)
UTF8_BOM = b"\xef\xbb\xbf"        # Windows editors start a saved file with one


def record_lines(path, error: type[SalactlError] = DatasetError, fix: str = "",
                 regular_only: bool = False) -> Iterator[tuple[int, str]]:
    """(line number, text) of each line of a records file, read one line at a time (a line ends at
    "\\r\\n", "\\r" or "\\n", as in other JSONL input: input_files.jsonl_lines). A path that is missing,
    a directory or unreadable, a line over MAX_RECORD_LINE (so /dev/zero ends at once) or one that
    is not UTF-8 raises `error`, naming the file (and line), then "; `fix`" where given; so
    does a path that is not a regular file (a device, FIFO) with `regular_only` (a file to append
    to). A pipe or process substitution is read as it comes. A UTF-8 byte-order mark before the
    first line is dropped."""
    path = Path(path)
    also = f"; {fix}" if fix else ""
    with _open_records(path, error, fix, regular_only) as f:
        offset = 0
        lines = jsonl_byte_lines(f, MAX_RECORD_LINE + 1)
        for lineno in itertools.count(1):
            try:
                raw = next(lines, b"")
            except OSError as e:
                raise error(f"cannot read records file {path}: {e.strerror or e}{also}") from None
            if not raw:
                return
            if len(raw) > MAX_RECORD_LINE:
                raise error(f"{path}:{lineno} is over {MAX_RECORD_LINE // 2**20} MiB, longer than any record "
                            f"(records files are JSON lines written by bench, sweep or run){also}")
            start = len(UTF8_BOM) if lineno == 1 and raw.startswith(UTF8_BOM) else 0
            try:
                text = raw[start:].decode("utf-8")
            except UnicodeDecodeError as e:
                raise error(f"{path}:{lineno} is not UTF-8 text (byte offset {offset + start + e.start}); records files "
                            f"are JSON lines written by bench, sweep or run{also}") from None
            offset += len(raw)
            yield lineno, text


def _open_records(path: Path, error: type[SalactlError], fix: str, regular_only: bool):
    """`path` opened for reading, once it is known not to be a directory (nor, with `regular_only`,
    anything but a regular file)."""
    give = fix or "give a JSON lines file from bench, sweep or run"
    try:
        st = os.stat(path)
        if stat.S_ISDIR(st.st_mode):
            inside = path / RECORDS_NAME
            raise error(f"records file {path} is a directory; " + (f"give {inside}" if inside.is_file() else give))
        if regular_only and not stat.S_ISREG(st.st_mode):
            raise error(f"records file {path} is not a regular file (a device, FIFO or socket); {give}")
        return open(path, "rb")
    except FileNotFoundError:
        raise error(f"records file {path} does not exist") from None
    except OSError as e:
        raise error(f"cannot read records file {path}: {e.strerror or e}" + (f"; {fix}" if fix else "")) from None


def parse_record_line(line: str):
    """A line's JSON value, or the reason it holds none (a str): a torn line, a foreign one, nesting
    too deep for the parser or an integer past int()'s digit limit."""
    try:
        return json.loads(line)
    except json.JSONDecodeError as e:
        return RecordLineError(e.msg)
    except RecursionError:
        return RecordLineError("nested too deeply")
    except ValueError:          # Python's int-from-string digit limit (sys.set_int_max_str_digits)
        return RecordLineError("an integer with too many digits")


class RecordLineError(str):
    """Why a records line holds no JSON value (parse_record_line)."""


def load_records(paths: list[Path]) -> list[dict]:
    """Read and validate every record; a records file that is missing, unreadable, not a regular
    file or holds no records, and a record that is not one, is a one-line DatasetError (exit 7, as
    other input files) naming file:line.

    A known metric that is present but not a finite number (a string, NaN, Infinity, an integer past
    float's range) is dropped from its record with a warning; a record left without any usable
    metric is skipped with a warning naming file:line, and an error when no record has one. A line
    that is not JSON (half a record, cut short by a full disk or a crash) is skipped with one
    warning per file; a file without records, or whose first line is not JSON (another kind of
    file, such as a JSON document spread over lines), is an error. A record that is the same as one
    read before (the same file given twice) is dropped with one warning."""
    if not paths:
        raise UsageError("give at least one records file (JSON lines from bench, sweep or run)")
    records: list[dict] = []
    invalid: list[str] = []          # "file:line (metric, ...)": bad values dropped
    unusable: list[str] = []         # "file:line": records without any usable metric
    damaged: dict[str, list[tuple[int, str]]] = {}     # file: (line, why) of each line that is not JSON
    seen: dict[str, str] = {}        # a record's canonical JSON -> the file:line it was first read from
    duplicates: list[str] = []       # "file:line (= file:line)"
    for path in paths:
        first = True
        for lineno, line in record_lines(path):
            if not line.strip():
                continue
            where = f"{path}:{lineno}"
            rec = parse_record_line(line)
            if isinstance(rec, RecordLineError):
                if first:
                    raise _not_json_lines(path, where, rec)
                damaged.setdefault(str(path), []).append((lineno, rec))
                continue
            first = False
            rec = validate(rec, where)
            canonical = json.dumps(rec, sort_keys=True)
            if canonical in seen:
                duplicates.append(where + (f" (= {seen[canonical]})" if seen[canonical] != where else ""))
                continue
            seen[canonical] = where
            bad = [m for m in METRICS if rec.get(m) is not None and not is_finite_number(rec[m])]
            if bad:
                rec = {k: (None if k in bad else v) for k, v in rec.items()}
            if not any(is_finite_number(rec.get(m)) for m in METRICS):
                unusable.append(f"{where} ({', '.join(bad)} not a finite number)" if bad else where)
                continue
            if bad:
                invalid.append(f"{where} ({', '.join(bad)})")
            records.append(rec)
        if first:
            raise DatasetError(f"no records in {path}; records files are the {RECORDS_NAME} that bench, sweep "
                               "or run --out DIR append to")
    if not records:         # every file has a record: each was skipped as unusable or a duplicate
        raise DatasetError(f"no record has a known metric as a finite number ({first_items(unusable)}); "
                           "records come from bench, sweep or run")
    for path, lines in damaged.items():
        warn_once(f"skipped {len(lines)} damaged line(s) of {path} (first: line {lines[0][0]})")
    if duplicates:
        warn_once(f"dropped {len(duplicates)} record(s) identical to one read before (a file given twice?): "
                  f"{first_items(duplicates)}")
    if invalid:
        warn_once(f"dropped metric values that are not finite numbers: {first_items(invalid)}")
    if unusable:
        warn_once(f"skipped {len(unusable)} record(s) without any known metric as a finite number: "
              f"{first_items(unusable)}")
    return records


# A --json output is kilobytes: a longer file is not named a JSON document (nor read whole to tell)
MAX_JSON_DOCUMENT = 4 * 2**20
READ_CHUNK = 2**16


def _not_json_lines(path, where: str, why: str) -> DatasetError:
    """The error for a records file whose first line is not JSON: one JSON document spread over
    lines (a --json output, kilobytes) is named as such where the file can be read again (not a pipe)."""
    whole = _json_document(path) if Path(path).is_file() else None
    if whole is None or isinstance(whole, RecordLineError):
        return DatasetError(f"{where} is not valid JSON ({why}); each line must be one record object")
    return DatasetError(f"{path} is a JSON document, not JSON lines (one record object per line); give the "
                        f"{RECORDS_NAME} that bench, sweep or run --out DIR append to")


def _json_document(path):
    """The file's whole text parsed (parse_record_line) where it is at most MAX_JSON_DOCUMENT bytes,
    else None. Read a chunk at a time: a small file never costs a buffer of the cap, which an
    address-space limit (ulimit -v) may refuse."""
    chunks, size = [], 0
    with open(path, "rb") as f:
        while chunk := f.read(READ_CHUNK):
            size += len(chunk)
            if size > MAX_JSON_DOCUMENT:
                return None
            chunks.append(chunk)
    return parse_record_line(b"".join(chunks).removeprefix(UTF8_BOM).decode("utf-8", "replace"))


def first_items(items: list[str]) -> str:
    more = f" and {len(items) - 5} more" if len(items) > 5 else ""
    return ", ".join(items[:5]) + more


def _shown(value) -> str:
    return json.dumps(value, default=str)[:40]


def validate(rec, where: str) -> dict:
    """`rec` when it is a record: a JSON object of this schema_version and a known kind, its phase a
    name, its other identity fields strings or null, its knobs and env objects; else a DatasetError."""
    if not isinstance(rec, dict):
        raise DatasetError(f"{where} is not a JSON object")
    version = rec.get("schema_version")
    if version is None:
        raise DatasetError(f"{where} is not a salactl record (no schema_version); records come from "
                           "bench, sweep or run --out")
    if isinstance(version, bool) or version != SCHEMA_VERSION:
        raise DatasetError(f"{where} has schema_version {_shown(version)}; this salactl reads version "
                           f"{SCHEMA_VERSION}")
    if rec.get("kind") not in KINDS:
        raise DatasetError(f"{where} has kind {_shown(rec.get('kind'))}; valid: {', '.join(KINDS)}")
    for key in ("knobs", "env"):
        if key in rec and not isinstance(rec[key], dict):
            raise DatasetError(f"{where}: {key!r} must be an object")
    phase = rec.get("phase")
    if not isinstance(phase, str) or not phase:
        got = "missing" if "phase" not in rec else f"got {_shown(phase)}"
        raise DatasetError(f"{where}: 'phase' must be the phase's name, a non-empty string ({got}); "
                           "records come from bench, sweep or run")
    for key in IDENTITY:
        if not isinstance(rec.get(key), (str, type(None))):
            raise DatasetError(f"{where}: {key!r} must be a string or null, got {_shown(rec[key])}; records "
                               "come from bench, sweep or run")
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
    return [m for m in METRICS if any(is_finite_number(r.get(m)) for r in records)]


def is_finite_number(v) -> bool:
    """A finite int or float that converts to a float (not a bool, NaN, infinity or an integer past
    float's range, which arithmetic with floats would overflow on)."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return False
    try:
        return math.isfinite(v)
    except OverflowError:           # an int past float's range (10**400)
        return False

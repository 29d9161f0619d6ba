"""SOAR-format JSONL datasets (`question` + `model_response` per line), parsed strictly.

Each non-blank line (lines end at "\\n" only: U+2028 inside a string is text) must be a JSON
object with a string prompt (`question`, or `input`/`prompt` as SGLang's conversion accepts) and a
string `model_response`. A bad line stops the load with its line number unless `skip_bad_rows`,
which drops it and says how many were dropped. As in SGLang's custom dataset: the prompt is raw
text (no chat template), the output length is the token count of `model_response` (tokenized
client-side with the model tokenizer, special tokens as the tokenizer adds them), rows are
shuffled with the seed and rows whose prompt or output is under 2 tokens are dropped.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

from salactl.bench.requests import BenchRequest
from salactl.errors import DatasetError
from salactl.input_files import check_tokenizer_memory, jsonl_lines, lone_surrogate, parse_json_line, read_text_option

PROMPT_KEYS = ("question", "input", "prompt")
RESPONSE_KEY = "model_response"
FIRST_BAD_LINES = 10        # skipped rows named in messages and records (a count for the rest)
# host bytes held per byte of the file: its text, its lines and their parsed strings (3 measured),
# then the token ids of the rows (a Python int and its tuple slot per token, a token per 3-4 bytes:
# 9 measured), once for every phase (the ids are shared)
DATASET_BYTES_PER_BYTE = 16


@dataclass(frozen=True)
class SoarRow:
    line: int
    prompt: str
    response: str


@dataclass
class LoadReport:
    rows: int = 0
    bad_lines: tuple[int, ...] = ()     # the first FIRST_BAD_LINES of them
    bad_rows: int = 0


def _row_problem(obj) -> str | None:
    if not isinstance(obj, dict):
        return f"is a JSON {type(obj).__name__}, not an object"
    key = next((k for k in PROMPT_KEYS if k in obj), None)
    if key is None:
        return f"has no prompt field (one of {', '.join(PROMPT_KEYS)})"
    if not isinstance(obj[key], str):
        return f"field {key!r} must be a string, got {type(obj[key]).__name__}"
    if RESPONSE_KEY not in obj:
        return f"has no {RESPONSE_KEY!r} field (its token count is the output length)"
    if not isinstance(obj[RESPONSE_KEY], str):
        return f"field {RESPONSE_KEY!r} must be a string, got {type(obj[RESPONSE_KEY]).__name__}"
    for k in (key, RESPONSE_KEY):
        surrogate = lone_surrogate(obj[k])
        if surrogate:
            return f"field {k!r} holds {surrogate}, which is no Unicode text"
    return None


def read_soar_rows(path: Path, skip_bad_rows: bool = False) -> tuple[list[SoarRow], LoadReport]:
    """Parse every line; raise DatasetError naming the first bad line unless skip_bad_rows."""
    path = Path(path)
    text = read_text_option(path, "dataset", "give SOAR-format JSONL in UTF-8", DATASET_BYTES_PER_BYTE)
    rows, bad, bad_rows = [], [], 0
    for lineno, line in jsonl_lines(text):
        if not line.strip():
            continue
        obj, problem = parse_json_line(line)
        if problem is None:
            problem = _row_problem(obj)
        if problem is not None:
            if not skip_bad_rows:
                raise DatasetError(f"{path}:{lineno}: row {problem}; fix the row or pass --skip-bad-rows")
            bad_rows += 1
            if len(bad) < FIRST_BAD_LINES:
                bad.append(lineno)
            continue
        key = next(k for k in PROMPT_KEYS if k in obj)
        rows.append(SoarRow(lineno, obj[key], obj[RESPONSE_KEY]))
    if not rows:
        why = f" ({bad_rows} bad rows skipped)" if bad_rows else ""
        raise DatasetError(f"dataset {path} has no usable rows{why}; it needs JSONL rows with "
                           f"'question' and '{RESPONSE_KEY}'")
    return rows, LoadReport(rows=len(rows), bad_lines=tuple(bad), bad_rows=bad_rows)


def _tokenized(row: SoarRow, tokenizer, path) -> tuple[tuple[int, ...], int]:
    """The prompt's ids and the response's token count, refused (exit 11) where the tokenizer
    could not hold the text (it aborts the process on a failed allocation)."""
    where = f"{path}:{row.line}" if path is not None else f"line {row.line}"
    fix = "shorten or drop the row"
    check_tokenizer_memory(row.prompt, f"the prompt of {where}", fix)
    check_tokenizer_memory(row.response, f"the {RESPONSE_KEY} of {where}", fix)
    return tuple(tokenizer.encode(row.prompt)), len(tokenizer.encode(row.response))


def soar_requests(rows: list[SoarRow], tokenizer, seed: int = 1, limit: int | None = None,
                  prefix: str = "r", cache: dict | None = None, path=None) -> tuple[list[BenchRequest], int]:
    """Shuffle with `seed`, tokenize, drop rows under 2 tokens, keep the first `limit`.
    Returns the requests and how many rows were too short. `cache` (line -> ids, output length),
    kept by the caller, tokenizes each row once for every phase that uses the file."""
    cache = {} if cache is None else cache
    order = list(rows)
    random.Random(seed).shuffle(order)
    out, too_short = [], 0
    for row in order:
        if limit is not None and len(out) == limit:
            break
        if row.line not in cache:
            cache[row.line] = _tokenized(row, tokenizer, path)
        ids, out_len = cache[row.line]
        if len(ids) < 2 or out_len < 2:
            too_short += 1
            continue
        out.append(BenchRequest(f"{prefix}{len(out)}", len(ids), out_len, ids, row.prompt, row.line))
    return out, too_short

"""SOAR-format JSONL datasets (`question` + `model_response` per line), parsed strictly.

Each non-blank line must be a JSON object with a string prompt (`question`, or `input`/`prompt`
as SGLang's conversion accepts) and a string `model_response`. A bad line stops the load with its
line number unless `skip_bad_rows`, which drops it and says how many were dropped. As in SGLang's
custom dataset: the prompt is raw text (no chat template), the output length is the token count
of `model_response` (tokenized client-side with the model tokenizer, special tokens as the
tokenizer adds them), rows are shuffled with the seed and rows whose prompt or output is under
2 tokens are dropped.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path

from salactl.bench.requests import BenchRequest
from salactl.errors import DatasetError
from salactl.output import read_text_option

PROMPT_KEYS = ("question", "input", "prompt")
RESPONSE_KEY = "model_response"


@dataclass(frozen=True)
class SoarRow:
    line: int
    prompt: str
    response: str


@dataclass
class LoadReport:
    rows: int = 0
    bad_lines: tuple[int, ...] = ()
    too_short: int = 0


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
    return None


def read_soar_rows(path: Path, skip_bad_rows: bool = False) -> tuple[list[SoarRow], LoadReport]:
    """Parse every line; raise DatasetError naming the first bad line unless skip_bad_rows."""
    path = Path(path)
    text = read_text_option(path, "dataset", "give SOAR-format JSONL in UTF-8")
    rows, bad = [], []
    for lineno, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
            problem = _row_problem(obj)
        except json.JSONDecodeError as e:
            problem = f"is not valid JSON ({e.msg} at column {e.colno})"
        if problem is not None:
            if not skip_bad_rows:
                raise DatasetError(f"{path}:{lineno}: row {problem}; fix the row or pass --skip-bad-rows")
            bad.append(lineno)
            continue
        key = next(k for k in PROMPT_KEYS if k in obj)
        rows.append(SoarRow(lineno, obj[key], obj[RESPONSE_KEY]))
    if not rows:
        why = f" ({len(bad)} bad rows skipped)" if bad else ""
        raise DatasetError(f"dataset {path} has no usable rows{why}; it needs JSONL rows with "
                           f"'question' and '{RESPONSE_KEY}'")
    return rows, LoadReport(rows=len(rows), bad_lines=tuple(bad))


def soar_requests(rows: list[SoarRow], tokenizer, seed: int = 1, limit: int | None = None,
                  prefix: str = "r") -> tuple[list[BenchRequest], int]:
    """Shuffle with `seed`, tokenize, drop rows under 2 tokens, keep the first `limit`.
    Returns the requests and how many rows were too short."""
    order = list(rows)
    random.Random(seed).shuffle(order)
    out, too_short = [], 0
    for row in order:
        if limit is not None and len(out) == limit:
            break
        ids = tokenizer.encode(row.prompt)
        out_len = len(tokenizer.encode(row.response))
        if len(ids) < 2 or out_len < 2:
            too_short += 1
            continue
        out.append(BenchRequest(f"{prefix}{len(out)}", len(ids), out_len, tuple(ids), row.prompt,
                                row.line))
    return out, too_short

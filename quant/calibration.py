"""Calibration token windows for `salactl quantize`: from a text or JSONL file (a "text" field per
line), from the built-in corpus (salactl.data.corpus, train split), or random ids (`--calib random`,
for timing runs with random weights). Documents are tokenized in a seeded order, joined with EOS and
cut into non-overlapping `seqlen` windows; the first `nsamples` windows are used."""

from __future__ import annotations

import json
import random
import re
from pathlib import Path

import torch

from salactl.errors import DatasetError, UsageError
from salactl.input_files import check_tokenizer_memory, jsonl_lines, lone_surrogate, parse_json_line, read_text_option

RANDOM = "random"
# host bytes held per byte of a --calib file: its text, its lines and their documents (the token
# ids stop at nsamples x seqlen)
CALIB_BYTES_PER_BYTE = 4


def read_documents(path: Path) -> list[str]:
    raw = read_text_option(path, "--calib", "give a text or JSONL file with a \"text\" field, or --calib random",
                           CALIB_BYTES_PER_BYTE)
    if path.suffix.lower() == ".jsonl":
        docs = []
        for lineno, line in jsonl_lines(raw):
            if not line.strip():
                continue
            obj, problem = parse_json_line(line)
            if problem is not None:
                raise DatasetError(f"{path}:{lineno} {problem}")
            if not isinstance(obj, dict) or not isinstance(obj.get("text"), str):
                raise DatasetError(f"{path}:{lineno} has no string \"text\" field")
            surrogate = lone_surrogate(obj["text"])
            if surrogate:
                raise DatasetError(f"{path}:{lineno} has {surrogate} in its \"text\", which is no Unicode text")
            docs.append(obj["text"])
        return [d for d in docs if d.strip()]
    if _is_json(raw):
        raise DatasetError(f"--calib {path} looks like JSON, which would be calibrated on as plain text with its "
                           "markup; save it as JSONL with a .jsonl suffix (one {\"text\": ...} object per line), "
                           "or pass plain text")
    # calibration wants the text's content: Windows (or old Mac) line endings are the editor's artifact
    text = re.sub(r"\r\n?", "\n", raw)
    return [text] if text.strip() else []


def _is_json(raw: str) -> bool:
    """Whether a --calib file read as plain text (its suffix is not .jsonl) is JSON: an array whose
    first element, or JSON lines whose first line, is an object with a "text" field; or, up to
    WHOLE_JSON_CHARS, any array or object as a whole. Text that merely starts with "{" or "[" (source
    code, a "[1]" reference) does not parse so, and is text."""
    start = re.search(r"\S", raw)
    if start is None or raw[start.start()] not in "[{":
        return False
    i = start.start()
    end = re.compile(r"[\r\n]").search(raw, i)
    if raw[i] == "{" and _has_text_field(raw[i:end.start() if end else len(raw)]):
        return True
    first = re.compile(r"\S").search(raw, i + 1)
    if raw[i] == "[" and first and raw[first.start()] == "{":
        try:
            obj, _ = json.JSONDecoder().raw_decode(raw, first.start())
        except (ValueError, RecursionError):
            obj = None
        if isinstance(obj, dict) and "text" in obj:
            return True
    if len(raw) > WHOLE_JSON_CHARS:
        return False
    try:
        json.loads(raw, object_pairs_hook=lambda pairs: None, parse_int=_none, parse_float=_none,
                   parse_constant=_none)
    except (ValueError, RecursionError):
        return False
    return True


# json.loads builds every string of the file: an array of short strings takes ~15 bytes a byte, far
# past CALIB_BYTES_PER_BYTE, so only a file this small is parsed whole
WHOLE_JSON_CHARS = 16 << 20


def _none(_) -> None:
    return None


def _has_text_field(line: str) -> bool:
    try:
        return json.loads(line, object_pairs_hook=lambda pairs: any(k == "text" for k, _ in pairs)) is True
    except (ValueError, RecursionError):
        return False


def builtin_documents() -> list[str]:
    try:
        from salactl.data.corpus import corpus_documents
    except ImportError:
        raise DatasetError("this install has no built-in calibration corpus (salactl.data.corpus); "
                           "pass --calib FILE (text, or JSONL with a \"text\" field)") from None
    return list(corpus_documents("train"))


def check_calibration_sizes(nsamples: int, seqlen: int) -> None:
    if nsamples < 1 or seqlen < 2:
        raise UsageError(f"nsamples (--nsamples) must be >= 1 and seqlen (--seqlen) >= 2 (got {nsamples}, {seqlen})")


def calibration_windows(calib: str | None, tokenizer, nsamples: int, seqlen: int, vocab_size: int,
                        seed: int = 0, eos_id: int | None = None) -> torch.Tensor:
    """Token windows [S, T] (long, on CPU); S <= nsamples, T = seqlen (or shorter if the whole
    calibration text is shorter than one window)."""
    check_calibration_sizes(nsamples, seqlen)
    if calib == RANDOM:
        gen = torch.Generator().manual_seed(seed)
        return torch.randint(0, vocab_size, (nsamples, seqlen), generator=gen)
    docs = builtin_documents() if calib is None else read_documents(Path(calib))
    where = "the built-in corpus" if calib is None else calib
    if not docs:
        raise DatasetError(f"the calibration set {where} is empty; give a file with text")
    if tokenizer is None:
        raise DatasetError("text calibration needs a tokenizer and none was found; pass --tokenizer, "
                           "or --calib random for a timing run")
    order = list(range(len(docs)))
    random.Random(seed).shuffle(order)
    need = nsamples * seqlen
    ids: list[int] = []
    for i in order:
        check_tokenizer_memory(docs[i], f"a document of {where}", "split it into smaller documents")
        ids.extend(tokenizer.encode(docs[i]))
        if eos_id is not None:
            ids.append(eos_id)
        if len(ids) >= need:
            break
    if len(ids) < 2:
        raise DatasetError(f"the calibration set {where} has fewer than 2 tokens")
    bad = next((t for t in ids if not 0 <= t < vocab_size), None)
    if bad is not None:
        raise DatasetError(f"calibration token id {bad} is outside the model's vocabulary ({vocab_size}); "
                           "use the model's own tokenizer")
    if len(ids) < seqlen:
        return torch.tensor(ids, dtype=torch.long)[None]
    n = min(nsamples, len(ids) // seqlen)
    return torch.tensor(ids[: n * seqlen], dtype=torch.long).view(n, seqlen)

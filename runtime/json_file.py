"""The one reader of a checkpoint's JSON side files (config.json, the safetensors index,
quantize_config.json, generation_config.json, tokenizer_config.json, ...): whatever is wrong with
the bytes is one line of the caller's error class naming the file."""

from __future__ import annotations

import json
from pathlib import Path

from salactl.errors import SalactlError


def read_json(path: Path, error: type[SalactlError], fix: str = "fix or remove it") -> object:
    """The parsed content of `path`. Text that is not UTF-8, not JSON, or nested too deeply for the
    parser (RecursionError) raises `error` with "{path} is ...; {fix}". A missing or unreadable file
    raises OSError, for the caller to decide whether the file is optional."""
    data = Path(path).read_bytes()
    try:
        return json.loads(data.decode("utf-8"))
    except UnicodeDecodeError as e:
        raise error(f"{path} is not UTF-8 text (byte 0x{data[e.start]:02x} at offset {e.start}); {fix}") from None
    except json.JSONDecodeError as e:
        raise error(f"{path} is not valid JSON ({e.msg} at line {e.lineno}); {fix}") from None
    except RecursionError:
        raise error(f"{path} nests JSON arrays/objects too deeply to parse; {fix}") from None

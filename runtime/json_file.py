"""The one reader of a checkpoint's JSON side files (config.json, the safetensors index,
quantize_config.json, generation_config.json, tokenizer_config.json, ...): whatever is wrong with
the bytes is one line of the caller's error class naming the file."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

from salactl.errors import SalactlError

MAX_SIDE_FILE = 64 * 2**20      # JSON settings and chat templates are kilobytes; a bigger one is not one


def check_regular_file(path: Path, error: type[SalactlError], limit: int, fix: str, name: str = "") -> None:
    """`path` (symlinks followed, as HF cache layouts need) is a regular file of at most `limit`
    bytes, else `error`, naming it as `name` (an option) where given: a device (/dev/zero) or FIFO
    would be read forever or block. A missing or unstat-able file raises OSError, for the caller to
    decide whether the file is optional."""
    st = os.stat(path)
    if not stat.S_ISREG(st.st_mode):
        raise error(f"{name + ' ' if name else ''}{path} is not a regular file; {fix}")
    if st.st_size > limit:
        raise error(f"{path} is {st.st_size} bytes, over the {limit // 2**20} MiB a checkpoint's side file "
                    f"may have; {fix}")


def read_side_file(path: Path, error: type[SalactlError], fix: str) -> bytes:
    """The bytes of a checkpoint's side file, refused as check_regular_file says (also when it grows
    past the limit while read)."""
    check_regular_file(path, error, MAX_SIDE_FILE, fix)
    with open(path, "rb") as f:
        data = f.read(MAX_SIDE_FILE + 1)
    if len(data) > MAX_SIDE_FILE:
        raise error(f"{path} is over the {MAX_SIDE_FILE // 2**20} MiB a checkpoint's side file may have; {fix}")
    return data


def read_json(path: Path, error: type[SalactlError], fix: str = "fix or remove it") -> object:
    """The parsed content of `path`. Not a regular file, over MAX_SIDE_FILE, text that is not UTF-8,
    not JSON, nested too deeply for the parser (RecursionError) or holding an integer too long to
    convert raises `error` with "{path} is ...; {fix}". A missing or unreadable file raises OSError,
    for the caller to decide whether the file is optional."""
    data = read_side_file(Path(path), error, fix)
    try:
        return json.loads(data.decode("utf-8"))
    except UnicodeDecodeError as e:
        raise error(f"{path} is not UTF-8 text (byte 0x{data[e.start]:02x} at offset {e.start}); {fix}") from None
    except json.JSONDecodeError as e:
        raise error(f"{path} is not valid JSON ({e.msg} at line {e.lineno}); {fix}") from None
    except RecursionError:
        raise error(f"{path} nests JSON arrays/objects too deeply to parse; {fix}") from None
    except ValueError:          # Python's int-from-string digit limit (sys.set_int_max_str_digits)
        raise error(f"{path} holds an integer with too many digits to parse; {fix}") from None

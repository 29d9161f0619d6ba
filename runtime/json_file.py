"""The one reader of a checkpoint's JSON side files (config.json, the safetensors index,
quantize_config.json, generation_config.json, tokenizer_config.json, ...): whatever is wrong with
the bytes is one line of the caller's error class naming the file."""

from __future__ import annotations

import errno
import json
import os
import stat
from pathlib import Path

from salactl.errors import SalactlError

MAX_SIDE_FILE = 64 * 2**20      # JSON settings and chat templates are kilobytes; a bigger one is not one
_READ_CHUNK = 2**20


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
    chunks, total = [], 0
    with open(path, "rb") as f:
        # read(n) allocates n bytes up front: one read of the whole cap would take 64 MiB for a
        # 2 KB config.json (a MemoryError under a tight address-space limit)
        while chunk := f.read(min(_READ_CHUNK, MAX_SIDE_FILE + 1 - total)):
            chunks.append(chunk)
            total += len(chunk)
            if total > MAX_SIDE_FILE:
                raise error(f"{path} is over the {MAX_SIDE_FILE // 2**20} MiB a checkpoint's side file may have; "
                            f"{fix}")
    return b"".join(chunks)


def lookup(path: Path, error: type[SalactlError], what: str = "") -> os.stat_result | None:
    """os.stat(path) (symlinks followed), None where nothing is there (no such name, a dangling
    symlink, a parent that is not a directory). What else stops the lookup (a directory above it
    without search permission, a name longer than the filesystem takes, a symlink loop) is `error`
    naming it as `what` (an option) where given: not a missing path, and no traceback."""
    try:
        return os.stat(path)
    except (FileNotFoundError, NotADirectoryError, ValueError):     # ValueError: an embedded NUL
        return None
    except OSError as e:
        fix = ("fix the permissions of the directories above it" if isinstance(e, PermissionError)
               else "fix the symlinks" if e.errno == errno.ELOOP else "give another path")
        raise error(f"cannot look up {what + ' ' if what else ''}{path} ({e.strerror or e}); {fix}") from None


def is_dir(path: Path, error: type[SalactlError], what: str = "") -> bool:
    """Path.is_dir(), but a path that cannot be looked up is `error`, as lookup() says."""
    st = lookup(path, error, what)
    return st is not None and stat.S_ISDIR(st.st_mode)


def cannot_read(path: Path, e: OSError, error: type[SalactlError], fix: str) -> SalactlError:
    """`error` for a file that is there but cannot be opened: "cannot read PATH (why); FIX", where a
    permission problem's fix is its permissions and a dangling symlink names what it points to."""
    why = e.strerror or str(e)
    if isinstance(e, FileNotFoundError) and os.path.islink(path):     # e.g. a cleaned HF-cache blob
        why = f"a symlink to {os.readlink(path)}, which does not exist"
    return error(f"cannot read {path} ({why}); {'fix its permissions' if isinstance(e, PermissionError) else fix}")


def read_optional_json(path: Path, error: type[SalactlError], missing: object = None) -> object:
    """read_json of a side file that may be left out; `missing` where no file has that name. One
    that is there but cannot be read (no permission, a dangling symlink, a symlink loop, a
    directory) is `error`: taking it for absent would silently drop its settings."""
    try:
        return read_json(path, error)
    except OSError as e:
        try:
            os.lstat(path)
        except (FileNotFoundError, NotADirectoryError):
            return missing
        except OSError:
            pass
        raise cannot_read(Path(path), e, error, "fix or remove it") from None


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

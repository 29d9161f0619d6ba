"""Reading user input files and text: prompt, calibration and dataset files read as UTF-8 within a
byte cap or the available host memory (ReadCap, read_text_option), the tokenizer's memory check,
JSONL split into lines and parsed one line at a time, and the checks and conversions for text that
arrives from JSON or the locale (lone_surrogate, utf8_text); every refusal is one line with its fix."""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

from salactl.runtime.surrogates import lone_surrogate_at


@dataclass(frozen=True)
class ReadCap:
    """The most bytes an input file may hold, read so far and no further (a device such as /dev/zero
    would be read forever; a FIFO is legitimate input), why that many, and the fix (exit 11 past it)."""

    max_bytes: int
    why: str
    fix: str


# Host bytes per byte of a text file while read_text_option holds it: the bytes, the decoded str (up
# to 4 bytes a character: one character past U+FFFF widens the whole string) and a copy of it (cutting
# a byte-order mark)
DECODED_BYTES_PER_BYTE = 9
_READ_CHUNK = 1 << 20


def memory_read_cap(per_byte: int, holder: str, fix: str, floor: int = 0) -> ReadCap | None:
    """A ReadCap of the available host memory over `per_byte` (the host bytes `holder` keeps per byte of
    the file; at least `floor`); None where the available memory is unknown."""
    from salactl.runtime.loader import available_host_bytes
    from salactl.units import human_bytes

    avail = available_host_bytes()
    if avail is None:
        return None
    return ReadCap(max(avail // per_byte, floor), f"the most {holder} in the {human_bytes(avail)} of memory "
                   f"available ({per_byte} bytes per byte of the file)", fix)


def read_text_option(path: Path, name: str, hint: str = "save it as UTF-8",
                     memory_per_byte: int | None = None, cap: ReadCap | None = None) -> str:
    """An input text file (`name`: its flag or what it is, e.g. "--calib", "dataset"), read as UTF-8
    whatever the locale says, without a leading byte-order mark (Windows editors write one) and with
    its line endings as they are ("\r\n" stays: a prompt or a text scored is the file's text); a
    one-line DatasetError (exit 7, as bench --dataset) when it is missing, unreadable or not UTF-8,
    the last saying `hint`. With `memory_per_byte` (the host bytes its reader holds per byte of the
    file), it must also be a regular file (a device such as /dev/zero would be read forever, a FIFO
    block) whose size fits the available host memory (else exit 11, before reading it). With `cap`,
    any file (a FIFO, a device) is read until it holds more than cap.max_bytes: exit 11."""
    from salactl.errors import DatasetError

    if memory_per_byte is not None:
        _check_input_file(path, name, hint, memory_per_byte)
    try:
        data = _read_capped(path, name, cap)
    except FileNotFoundError:
        raise DatasetError(f"{name} {path} does not exist; check the path") from None
    except OSError as e:
        raise DatasetError(f"cannot read {name} {path}: {e.strerror}; give a readable file") from None
    try:
        # not "utf-8-sig": its decode errors count bytes from after the mark
        return data.decode("utf-8").removeprefix("\ufeff")
    except UnicodeDecodeError as e:
        line = 1 + sum(1 for _ in _LINE_END_BYTES.finditer(data, 0, e.start))
        raise DatasetError(f"{name} {path}:{line} is not UTF-8 text ({e.reason} at byte offset {e.start}); "
                           f"{hint}") from None


def _read_capped(path: Path, name: str, cap: ReadCap | None) -> bytes:
    from salactl.errors import CapacityError
    from salactl.units import human_bytes

    with open(path, "rb") as f:
        if cap is None:
            return f.read()
        chunks, total = [], 0
        while chunk := f.read(min(_READ_CHUNK, cap.max_bytes + 1 - total)):
            chunks.append(chunk)
            total += len(chunk)
            if total > cap.max_bytes:
                raise CapacityError(f"{name} {path} holds more than {human_bytes(cap.max_bytes)} ({cap.max_bytes:,} "
                                    f"bytes), {cap.why}; {cap.fix}")
    return b"".join(chunks)


def _check_input_file(path: Path, name: str, hint: str, memory_per_byte: int) -> None:
    from salactl.errors import DatasetError
    from salactl.runtime.json_file import check_regular_file
    from salactl.runtime.loader import available_host_bytes, check_fits
    from salactl.units import human_bytes

    try:
        check_regular_file(path, DatasetError, 1 << 62, hint, name)
    except FileNotFoundError:
        raise DatasetError(f"{name} {path} does not exist; check the path") from None
    except OSError as e:
        raise DatasetError(f"cannot read {name} {path}: {e.strerror}; give a readable file") from None
    size, avail = path.stat().st_size, available_host_bytes()
    fits = "" if avail is None else f" (up to about {human_bytes(avail // memory_per_byte)} fits)"
    check_fits(size * memory_per_byte, avail, f"reading {name} {path} ({human_bytes(size)})", "this machine",
               f"give a smaller file{fits}")


# Host bytes the tokenizers library holds per UTF-8 byte while it encodes one string (its offsets and
# alignments per byte, then per token): 120-430 measured on plain text, digits and CJK, rounded up
TOKENIZER_BYTES_PER_BYTE = 512
TOKENIZER_CHECK_FROM = 1 << 18     # characters; shorter strings need under 512 MiB, unchecked


def check_tokenizer_memory(text: str, what: str, fix: str) -> None:
    """Refuse (exit 11) a string whose encoding the tokenizer could not hold in the available host
    memory: the library aborts the whole process when an allocation fails."""
    if len(text) < TOKENIZER_CHECK_FROM:
        return
    from salactl.runtime.loader import available_host_bytes, check_fits

    size = len(text.encode("utf-8", "surrogatepass"))
    avail = available_host_bytes()
    fits = "" if avail is None else f" (about {avail // TOKENIZER_BYTES_PER_BYTE:,} bytes of UTF-8 fit)"
    check_fits(size * TOKENIZER_BYTES_PER_BYTE, avail, f"tokenizing {what} ({size:,} bytes of UTF-8)",
               "this machine", fix + fits)


# A JSONL line ends at "\r\n", "\r" (old Mac files) or "\n": JSON holds no raw CR or LF inside a string.
# Not at U+2028, U+2029 or U+0085, where str.splitlines() also splits: JSON writers leave those raw
# inside strings (json.dumps(ensure_ascii=False)).
_LINE_END = re.compile(r"\r\n|\r|\n")
_LINE_END_BYTE = re.compile(rb"[\r\n]")
_LINE_END_BYTES = re.compile(rb"\r\n|\r|\n")     # _LINE_END in bytes


def jsonl_lines(text: str):
    """(line number, line) of JSONL text, split at each line end (_LINE_END), which is dropped."""
    for lineno, line in enumerate(_LINE_END.split(text), start=1):
        yield lineno, line


def jsonl_byte_lines(f, limit: int):
    """The lines of JSONL read from the binary file `f` (open(path, "rb")), each as bytes with its line
    end (_LINE_END), as they come: a pipe is not read ahead of what has been written, except that a
    line ending in "\\r" waits for the next byte (or the end), which may be the "\\n" of a "\\r\\n". A
    line longer than `limit` bytes comes in pieces of `limit` bytes, as f.readline(limit) gives it."""
    buf, scanned, eof = bytearray(), 0, False       # buf[:scanned] holds no line end
    while buf or not eof:
        m = _LINE_END_BYTE.search(buf, scanned, limit)
        # a line is whole at a "\n", at a "\r" with the byte after it read, at the end or at `limit`
        if (m and (buf[m.start()] == ord("\n") or m.end() < len(buf))) or eof or len(buf) >= limit:
            end = min(m.end() + (buf[m.start():m.end() + 1] == b"\r\n") if m else len(buf), limit)
            yield bytes(buf[:end])
            del buf[:end]
            scanned = 0
        else:
            scanned = m.start() if m else len(buf)
            chunk = f.read1(_READ_CHUNK)
            eof = not chunk
            buf += chunk


def parse_json_line(line: str) -> tuple[object, str | None]:
    """(the value of one JSONL line, None), or (None, why it is none: "is not valid JSON (...)", ...)."""
    try:
        return json.loads(line), None
    except json.JSONDecodeError as e:
        # several of json's messages end in "at" ("Unterminated string starting at")
        return None, f"is not valid JSON ({e.msg.removesuffix(' at')} at column {e.colno})"
    except RecursionError:
        return None, "nests JSON arrays/objects too deeply to parse"
    except ValueError:          # Python's int-from-string digit limit (sys.set_int_max_str_digits)
        return None, "holds an integer with too many digits to parse"


def lone_surrogate(text: str) -> str | None:
    """Where `text` (from JSON, which may escape one: "\\ud83d") holds half of a surrogate pair,
    which is no Unicode character and cannot be encoded or tokenized; None where it holds none."""
    at = lone_surrogate_at(text)
    return None if at is None else f"a lone surrogate (U+{ord(text[at]):04X} at character offset {at})"


def model_record_name(source: str) -> str:
    """A model as records name it, as UTF-8: its checkpoint directory (a preset's too) as an absolute,
    resolved path, so that it names the same model wherever the record is read; else (random weights)
    the source as given."""
    return utf8_text(str(Path(source).resolve()) if Path(source).is_dir() else source)


def utf8_text(text: str) -> str:
    """Text Python decoded with the locale's encoding (argv, file names), decoded as UTF-8 instead, as
    a UTF-8 locale gives it: under LC_ALL=C (ASCII) "é" arrives as the lone surrogates "\\udcc3\\udca9".
    A byte that is not UTF-8 stays a lone surrogate ("\\udcff"), for the caller to refuse or show as
    it would under a UTF-8 locale. Text that no such bytes gave (not encodable back) is returned as is."""
    if text.isascii():
        return text
    try:
        return os.fsencode(text).decode("utf-8", "surrogateescape")
    except UnicodeEncodeError:
        return text

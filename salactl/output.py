"""Output conventions: data on stdout (JSON or rich tables), everything else on stderr."""

from __future__ import annotations

import errno
import hashlib
import io
import json
import math
import os
import re
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path, PurePath

from rich.console import Console
from rich.measure import Measurement
from rich.table import Table

from salactl.errors import OutputWriteError, UsageError
from salactl.runtime.surrogates import lone_surrogate_at


class _Console(Console):
    def on_broken_pipe(self) -> None:
        """A closed pipe (`salactl ... | head -1`) raises what a plain write raises, so that cli.main
        treats both alike (exit 141, no message); rich's own handler exits 1."""
        self.quiet = True
        raise BrokenPipeError(errno.EPIPE, os.strerror(errno.EPIPE))


# markup off: messages and table cells carry user text and install hints ("pip install
# 'salactl[plots]'", paths, list reprs) that rich would otherwise read as style tags and drop
stdout = _Console(soft_wrap=True, width=None if sys.stdout is not None and sys.stdout.isatty() else 160,
                  markup=False)
stderr = _Console(stderr=True, soft_wrap=True, markup=False)


_warned: set[str] = set()


def warn_once(message: str) -> None:
    """One `warning: ...` line on stderr per distinct message and process."""
    if message not in _warned:
        _warned.add(message)
        stderr.print(f"warning: {message}")


def warn_past_trained_length(tokens: int, limit: int, what: str) -> None:
    """The model runs past max_position_embeddings (the 9B is run at 1M tokens on purpose), but
    the user should know that quality there is not what it was trained for."""
    if tokens > limit:
        warn_once(f"{what} is {tokens:,} tokens, past the model's max_position_embeddings ({limit:,}); "
                  "it runs, but quality beyond the trained length is not guaranteed")


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


def directory_option(path: Path | None, flag: str = "--out", files: tuple[str, ...] = ()) -> Path | None:
    """A directory option's path (None passes), checked before any work starts: a usage error when
    it is a file, lies below a file, is or lies below a symlink to a missing target, cannot be
    created (no file can be made in the nearest existing directory), holds a directory where one of
    `files` must be written, or holds one of `files` that cannot be opened for writing (an empty
    value is refused when the option is parsed: options.non_empty_path)."""
    if path is None:
        return None
    _check_name_lengths(path, flag)
    _refuse_dangling_link(path, flag)
    if path.exists() and not path.is_dir():
        raise UsageError(f"{flag} {path} is a file; give a directory")
    existing = next(p for p in (path, *path.absolute().parents) if p.exists())
    if not existing.is_dir():
        raise UsageError(f"{flag} {path} lies below {existing}, which is a file; give a directory")
    _probe_writable(existing, path, flag)
    taken = next((name for name in files if (path / name).is_dir()), None)
    if taken is not None:
        raise UsageError(f"{flag} {path}: {path / taken} is a directory, where a file must go")
    for name in files:
        _probe_appendable(path / name, path, flag)
    return path


def _refuse_dangling_link(path: Path, flag: str) -> None:
    """A symlink whose target is missing, as `path` or a directory above it up to the nearest one that
    exists: it reads as absent, so the check passes, but creating the directory fails after the work."""
    for p in (path, *path.parents):
        if p.exists():
            return
        if p.is_symlink():
            try:
                target = os.readlink(p)
            except OSError:
                target = "?"
            where = f"{flag} {path} is" if p == path else f"{flag} {path}: {p} is"
            raise UsageError(f"{where} a symlink to {target}, which does not exist; remove the link or "
                             f"point {flag} elsewhere")


def _check_name_lengths(path: Path, flag: str) -> None:
    """A name longer than its file system allows (NAME_MAX, 255 bytes almost everywhere) is a usage
    error now, not an OSError (exit 1) at its first use."""
    path = path.absolute()
    existing = next(p for p in path.parents if os.path.isdir(p))
    try:
        limit = os.pathconf(existing, "PC_NAME_MAX")
    except (AttributeError, OSError, ValueError):       # no pathconf (Windows), or no such limit
        limit = 255
    for part in path.parts[1:]:
        if len(os.fsencode(part)) > limit:
            raise UsageError(f"{flag}: the name {part[:24]}... is {len(os.fsencode(part))} bytes, more than the "
                             f"{limit} its file system allows; choose a shorter name")


def short_name(path: Path) -> str:
    """path's name as the temp and backup names beside it carry it: a long one (up to NAME_MAX, 255
    bytes) is cut to 40 bytes plus a digest of the whole, so those names stay inside NAME_MAX."""
    raw = os.fsencode(path.name)
    if len(raw) <= 64:
        return path.name
    return os.fsdecode(raw[:40]) + "~" + hashlib.sha256(raw).hexdigest()[:12]


def _probe_appendable(file: Path, path: Path, flag: str) -> None:
    """Open `file`, where it exists, for appending and close it: a read-only file (its mode, a
    read-only bind mount) is found now, not when the results are ready. Non-blocking, so that a
    FIFO without a reader fails instead of hanging."""
    try:
        fd = os.open(file, os.O_WRONLY | os.O_APPEND | getattr(os, "O_NONBLOCK", 0))
    except FileNotFoundError:
        return
    except OSError as e:
        raise UsageError(f"{flag} {path}: cannot write {file} ({e.strerror or e}); make it writable or "
                         f"choose another {flag}") from None
    os.close(fd)


def _probe_writable(existing: Path, path: Path, flag: str) -> None:
    """Create and remove a file in the nearest existing directory: permission bits alone miss
    read-only file systems, /proc and root's view of them."""
    try:
        fd, probe = tempfile.mkstemp(prefix=".salactl-probe.", dir=existing)
    except OSError as e:
        raise UsageError(f"{flag} {path}: cannot write in {existing} ({e.strerror or e}); "
                         "give a directory you can write") from None
    os.close(fd)
    os.unlink(probe)


def jsonable(obj):
    """inf/nan are not JSON: store them as strings ("inf"), recursively; -0.0 becomes 0.0; a path
    becomes its name as UTF-8 (utf8_text)."""
    if isinstance(obj, float) and (math.isnan(obj) or math.isinf(obj)):
        return str(obj)
    if isinstance(obj, float) and obj == 0:
        return 0.0
    if isinstance(obj, dict):
        return {k: jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [jsonable(v) for v in obj]
    if isinstance(obj, PurePath):       # the file system's bytes as UTF-8, as utf8_text
        return utf8_text(str(obj))
    return obj


class StdoutWriteError(OutputWriteError):
    """stdout could not take what the command printed (a full disk, a file-size limit); what it took
    stays there, cut short, so the exit code (16) is what tells."""

    def __init__(self, e: OSError):
        from salactl.reports.atomic import write_remedy

        super().__init__(f"cannot write to stdout: {e.strerror or e}; {write_remedy(e, 'redirect it elsewhere')}")


class _WholeWrites(io.RawIOBase):
    """stdout's file descriptor, every write of it whole or a StdoutWriteError. Python's own stdout,
    unbuffered (PYTHONUNBUFFERED, -u), drops the rest of a short write: one that reaches a file-size
    limit (ulimit -f; Python ignores SIGXFSZ) writes the bytes below it and the command exits 0. A
    closed pipe stays a BrokenPipeError (exit 141)."""

    def __init__(self, fd: int):
        super().__init__()
        self._fd = fd

    def writable(self) -> bool:
        return True

    def fileno(self) -> int:
        return self._fd

    def isatty(self) -> bool:
        return os.isatty(self._fd)

    def write(self, b) -> int:
        view = memoryview(b).cast("B")
        done = 0
        while done < len(view):
            try:
                n = os.write(self._fd, view[done:])
                if not n:       # a device that takes nothing: looping would never end
                    raise OSError(errno.EIO, os.strerror(errno.EIO))
                done += n
            except BlockingIOError:         # a non-blocking stream another program set: wait for room
                import select

                select.select([], [self._fd], [])
            except OSError as e:
                self._failed(e)
                return len(view)
        return done

    def _failed(self, e: OSError) -> None:
        if isinstance(e, BrokenPipeError):
            raise e
        raise StdoutWriteError(e) from None


class _BestEffortWrites(_WholeWrites):
    """stderr's file descriptor, whose writes never fail the command: progress, warnings and the
    error line are for a person, so a stderr that cannot take them (a full disk, a closed pipe, a
    descriptor open for reading) must cost neither the results nor the exit code. At the first
    failure fd 2 itself is pointed at /dev/null, for every writer of it (rich's refresh thread,
    sys.__stderr__, C code), and the rest is discarded."""

    def _failed(self, e: OSError) -> None:
        try:
            null = os.open(os.devnull, os.O_WRONLY)
            os.dup2(null, self._fd)
            os.close(null)
        except OSError:         # then each later write fails and is dropped in turn
            pass


def _rewrap(name: str, raw_writes: type) -> None:
    """Point sys.<name> at raw_writes over the same file descriptor, keeping its encoding and
    buffering, where it is the process's own file-backed stream (not a test's capture, a Windows
    console)."""
    old = getattr(sys, name)
    buffer = getattr(old, "buffer", None)
    raw = getattr(buffer, "raw", buffer)
    if old is not getattr(sys, f"__{name}__") or not isinstance(old, io.TextIOWrapper) or type(raw) is not io.FileIO:
        return
    try:
        old.flush()
    except (OSError, ValueError):
        pass
    writes = raw_writes(raw.fileno())
    unbuffered = buffer is raw
    setattr(sys, name, io.TextIOWrapper(writes if unbuffered else io.BufferedWriter(writes), encoding=old.encoding,
                                        errors=old.errors, newline=None if os.name == "nt" else "\n",
                                        line_buffering=old.line_buffering, write_through=unbuffered))


def check_stdout_writes() -> None:
    """A failed write of stdout is then exit 16 with one line, not exit 1 naming no file (buffered)
    or exit 0 with the output cut short (unbuffered)."""
    _rewrap("stdout", _WholeWrites)


def stderr_best_effort() -> None:
    """A failed write of stderr is then dropped (_BestEffortWrites); rich's stderr console writes
    through sys.stderr too, so its bars and status lines are covered."""
    _rewrap("stderr", _BestEffortWrites)


class ClosedStdout(io.TextIOBase):
    """sys.stdout where stdout was closed before the start (`salactl ... >&-`; pythonw has none).
    What the command prints there is dropped, and once it is done (its --out files written, even
    those of `run`, which streams text before them) raise_if_dropped makes that exit 16 with one
    line, as on a full disk: results lost in silence would pass for success (`echo hi >&-` fails
    too). A command with nothing for stdout runs as usual. It keeps `null`, the /dev/null opened in
    fd 1's place, so that no file opened later takes fd 1 and receives what a subprocess prints."""

    encoding = "utf-8"

    def __init__(self, null):
        super().__init__()
        self._null = null
        self._dropped = False

    def writable(self) -> bool:
        return True

    def fileno(self) -> int:
        return self._null.fileno()

    def write(self, s: str) -> int:
        self._dropped = self._dropped or bool(s)
        return len(s)

    def raise_if_dropped(self) -> None:
        if self._dropped:
            raise OutputWriteError("cannot write the results to stdout: it is closed; redirect it to a file, "
                                   "or to /dev/null to discard them")


def print_json(obj) -> None:
    sys.stdout.write(json.dumps(jsonable(obj), indent=2, default=str) + "\n")
    sys.stdout.flush()


def table(title: str, columns: list[str], rows: list[list], console: Console = stdout) -> None:
    t = Table(title=title, title_justify="left")
    for i, c in enumerate(columns):
        t.add_column(c, justify="left" if i == 0 else "right")
    for r in rows:
        t.add_row(*[fmt(v) for v in r])
    console.print(_NaturalWidth(t))


class _NaturalWidth:
    """A table at its natural width, past the console's where it is wider: the terminal then wraps
    or scrolls it, where rich would squeeze the columns and cut numbers and headers to "…"."""

    def __init__(self, table: Table):
        self.table = table

    def __rich_console__(self, console: Console, options):
        natural = Measurement.get(console, options.update_width(1 << 20), self.table).maximum
        yield from console.render(self.table, options.update_width(natural) if natural > options.max_width
                                  else options)


def rate(v: float) -> str:
    """A roofline ceiling: whole numbers for a GPU's (989 TFLOP/s, not 9.9e+02), two significant
    digits for small ones (a CPU's 0.2 TFLOP/s)."""
    return f"{v:.0f}" if v >= 10 else f"{v:.2g}"


def ceilings(peaks: dict) -> str:
    """A roofline record's ceilings (runtime/peaks.py Peaks.for_dtype) in words: "25 GB/s, 0.1
    TFLOP/s (fp32 matmul, 0.4 TFLOP/s bf16 for the quantized linears; measured)"; a record written
    before compute_rate existed is bf16's."""
    quantized = (f", {rate(peaks['quantized_compute_tflops'])} TFLOP/s {peaks['quantized_compute_rate']} for the "
                 "quantized linears" if "quantized_compute_tflops" in peaks else "")
    return (f"{rate(peaks['mem_gbps'])} GB/s, {rate(peaks.get('compute_tflops', peaks['bf16_tflops']))} TFLOP/s "
            f"({peaks.get('compute_rate', 'bf16')} matmul{quantized}; {peaks['source']})")


def fmt(v) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        if v == 0:
            return "0"
        a = abs(v)
        if a >= 1e4 or a < 1e-3:
            return f"{v:.3g}"
        return f"{v:.4g}" if a < 100 else f"{v:.1f}"
    return str(v)


class PrefillProgress:
    """A transient prefill bar on stderr, shown only on a terminal and only while a multi-chunk
    prompt is being prefilled (it is gone before generated text streams to stdout). Use it as a
    context manager: leaving it erases a bar an error or Ctrl-C cut short and shows the cursor again."""

    def __init__(self):
        self._bar = None

    def __enter__(self) -> "PrefillProgress":
        return self

    def __exit__(self, *exc) -> None:
        if self._bar is not None:
            self._bar.live.stop()   # not bar.stop(): on a dumb terminal it adds a blank line

    def __call__(self, done: int, total: int) -> None:
        if not stderr.is_terminal:
            return
        if self._bar is None:
            if done >= total:
                return
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

            self._bar = Progress(TextColumn("prefill tokens"), BarColumn(), MofNCompleteColumn(),
                                 TimeRemainingColumn(), console=stderr, transient=True)
            self._task = self._bar.add_task("prefill", total=total)
            self._bar.start()
        self._bar.update(self._task, completed=done)
        if done >= total:
            self._bar.stop()

"""The write contracts of the process's standard streams: a failed write of stdout is exit 16 with one
line (StdoutWriteError, check_stdout_writes), a failed write of stderr is dropped so that it costs
neither the results nor the exit code (stderr_best_effort), and a stdout closed before the start
drops what is printed and then fails the command (ClosedStdout)."""

from __future__ import annotations

import errno
import io
import os
import sys

from salactl.errors import OutputWriteError


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

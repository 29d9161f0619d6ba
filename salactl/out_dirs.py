"""Checks of a directory option (`--out`) before any work starts: it must be, or be creatable as, a
writable directory whose names fit the file system and whose result files can be opened for writing;
and short_name, the cut-down name that the temp and backup files written beside a path carry."""

from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path

from salactl.errors import UsageError


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
    read-only file systems, /proc and root's view of them. A Ctrl-C or SIGTERM waits until the probe
    is gone, so an interrupted command leaves no probe file behind."""
    from salactl.bench.records import interrupts_deferred

    with interrupts_deferred():
        try:
            fd, probe = tempfile.mkstemp(prefix=".salactl-probe.", dir=existing)
        except OSError as e:
            raise UsageError(f"{flag} {path}: cannot write in {existing} ({e.strerror or e}); "
                             "give a directory you can write") from None
        os.close(fd)
        os.unlink(probe)

"""Write output files all-or-nothing. One file: `write_atomic` (or `atomic_path` for a writer that
takes a file name) writes to a temp name beside it and renames that onto it. Several files
(`write_all`, `move_all`): every destination is checked first, every file goes to a temp name in its
directory, and only when all are written are they renamed into place; a rename that still fails
midway puts back what the earlier renames replaced."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from salactl.errors import OutputExistsError, UsageError


def check_out_dir(out: Path, names: tuple[str, ...], overwrite: bool = False, flag: str = "--out") -> Path:
    """Before any work: `out` must be a directory that can be created and written in, and each of
    `names` in it a file that does not exist yet (or `overwrite`)."""
    from salactl.output import directory_option

    directory_option(out, flag, files=names)
    check_destinations([out / n for n in names], overwrite)
    return out


def check_destinations(paths, overwrite: bool) -> None:
    for path in map(Path, paths):
        if path.is_dir():
            raise UsageError(f"{path} is a directory, where a file must go; remove it or choose another --out")
        if path.exists() and not overwrite:
            raise OutputExistsError(f"{path} already exists; choose another --out or pass --overwrite")


def write_atomic(path: Path, data: str | bytes) -> None:
    """One file all-or-nothing: `data` (str as UTF-8, bytes as they are) goes to a temp name beside
    `path`, then is renamed onto it; a failed write leaves `path` as it was and no temp behind."""
    with atomic_path(path) as tmp:
        if isinstance(data, bytes):
            tmp.write_bytes(data)
        else:
            tmp.write_text(data, encoding="utf-8")


@contextmanager
def atomic_path(path: Path) -> Iterator[Path]:
    """A temp path beside `path` for a writer that takes a file name (a profiler's export, a
    plotting library's savefig); renamed onto `path` when the block ends, removed when it raises."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp{path.suffix}")
    try:
        yield tmp
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def write_all(files: dict[Path, str | bytes], overwrite: bool = True) -> list[Path]:
    files = {Path(p): data for p, data in files.items()}
    check_destinations(files, overwrite)
    temps: list[tuple[Path, Path]] = []
    try:
        for path, data in files.items():
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
            temps.append((tmp, path))
            if isinstance(data, bytes):
                tmp.write_bytes(data)
            else:
                tmp.write_text(data, encoding="utf-8")
        _rename_all(temps)
    finally:
        for tmp, _ in temps:
            tmp.unlink(missing_ok=True)
    return [p for _, p in temps]


def move_all(staging: Path, out: Path, overwrite: bool = True) -> list[Path]:
    """Move every file of the directory `staging` into `out` all-or-nothing (same filesystem: a
    staging directory beside `out`)."""
    moves = [(f, out / f.name) for f in sorted(staging.iterdir()) if f.is_file()]
    check_destinations([dst for _, dst in moves], overwrite)
    out.mkdir(parents=True, exist_ok=True)
    _rename_all(moves)
    return [dst for _, dst in moves]


def _rename_all(temps: list[tuple[Path, Path]]) -> None:
    """Rename every temp onto its path; keep a backup of each replaced file until all are done."""
    done: list[tuple[Path, Path | None]] = []
    try:
        for tmp, path in temps:
            backup = _backup(path)
            done.append((path, backup))
            os.replace(tmp, path)
    except BaseException:
        for path, backup in reversed(done):
            if backup is not None:
                os.replace(backup, path)
            else:
                path.unlink(missing_ok=True)
        raise
    finally:
        for _, backup in done:
            if backup is not None:
                backup.unlink(missing_ok=True)


def _backup(path: Path) -> Path | None:
    """A second name for the file at `path` (a hard link, or a copy where links are refused)."""
    if not path.exists():
        return None
    backup = path.with_name(f".{path.name}.{os.getpid()}.bak")
    backup.unlink(missing_ok=True)
    try:
        os.link(path, backup)
    except OSError:
        shutil.copy2(path, backup)
    return backup

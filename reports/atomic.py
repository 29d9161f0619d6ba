"""Write output files all-or-nothing. One file: `write_atomic` (or `atomic_path` for a writer that
takes a file name) writes to a temp name beside it and renames that onto it. Several files
(`write_all`, `move_all`): every destination is checked first, every file goes to a temp name in its
directory, and only when all are written are they renamed into place; a rename that still fails
midway puts back what the earlier renames replaced. Without overwrite, each file is hard-linked into
place instead, which refuses a file another process wrote meanwhile. A disk that fills up is a
DiskFullError (exit 16) naming the output, with no temp file, nor a directory the write made, left
behind.

`exclusive_lock` serialises the writers of one file across processes."""

from __future__ import annotations

import contextlib
import errno
import itertools
import os
import shutil
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

try:
    import fcntl
except ImportError:         # Windows
    fcntl = None
    import msvcrt

from salactl.errors import OutputExistsError, OutputWriteError, UsageError

DISK_FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)


def free_space(elsewhere: str = "choose another --out") -> str:
    """The remedy for a write that found no room (or, with no errno to tell, may have)."""
    return f"free space on its disk or {elsewhere}"


def write_remedy(e: OSError, elsewhere: str = "choose another --out") -> str:
    """What to do about a failed write, by its errno: free space only when space is the problem."""
    if e.errno in (errno.ENOSPC, errno.EDQUOT):
        return free_space(elsewhere)
    if e.errno == errno.EFBIG:
        return f"the file reached a size limit of its file system or of this process (ulimit -f); {elsewhere}"
    if e.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        return f"make it writable or {elsewhere}"
    return elsewhere


class DiskFullError(OutputWriteError):
    """An output the disk had no room for (full, over quota, past a file-size limit); `path`,
    `reason` and `remedy` (by errno: freeing space is no help past a size limit) let a caller that
    stages its files name the output its own way."""

    def __init__(self, path: Path, error: OSError):
        self.path, self.error = path, error
        self.reason = error.strerror
        self.remedy = write_remedy(error)
        super().__init__(f"cannot write {path}: {self.reason}; {self.remedy}")


@contextmanager
def _disk_full_names(path: Path) -> Iterator[None]:
    """An OSError that says the disk is full becomes a DiskFullError naming `path`; others pass as
    they are (callers tell, say, a directory in the way from a full disk)."""
    try:
        yield
    except OSError as e:
        if e.errno not in DISK_FULL_ERRNOS:
            raise
        raise DiskFullError(path, e) from e


def check_out_dir(out: Path, names: tuple[str, ...], overwrite: bool = False) -> Path:
    """Before any work: `out` must be a directory that can be created and written in, and each of
    `names` in it a file that does not exist yet (or `overwrite`)."""
    from salactl.out_dirs import directory_option

    directory_option(out, "--out", files=names)
    check_destinations([out / n for n in names], overwrite)
    return out


def check_destinations(paths, overwrite: bool) -> None:
    for path in map(Path, paths):
        if path.is_dir():
            raise UsageError(f"{path} is a directory, where a file must go; remove it or choose another --out")
        if path.exists() and not overwrite:
            raise _already_exists(path)


def _already_exists(path: Path) -> OutputExistsError:
    return OutputExistsError(f"{path} already exists; choose another --out or pass --overwrite")


def write_atomic(path: Path, data: str | bytes) -> None:
    """One file all-or-nothing: `data` (str as UTF-8, bytes as they are) goes to a temp name beside
    `path`, then is renamed onto it; a failed write leaves `path` as it was and no temp behind. A lone
    surrogate in str (a byte of a non-UTF-8 file name or label, as Python decodes it) is written as its
    escape, \\udce9, not refused."""
    with atomic_path(path) as tmp:
        _write_data(tmp, data)


def _write_data(path: Path, data: str | bytes) -> None:
    if isinstance(data, bytes):
        path.write_bytes(data)
    else:
        # newline="": "\n" stays "\n" on Windows too; backslashreplace: only a lone surrogate needs it
        path.write_text(data, encoding="utf-8", errors="backslashreplace", newline="")


@contextmanager
def atomic_path(path: Path) -> Iterator[Path]:
    """A temp path beside `path` for a writer that takes a file name (a profiler's export, a
    plotting library's savefig); renamed onto `path` when the block ends, removed when it raises."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp{path.suffix}")
    with _disk_full_names(path), new_dirs(path.parent):
        try:
            yield tmp
            os.replace(tmp, path)
        finally:
            tmp.unlink(missing_ok=True)


def write_all(files: dict[Path, str | bytes], overwrite: bool = True) -> list[Path]:
    files = {Path(p): data for p, data in files.items()}
    if not files:
        return []
    check_destinations(files, overwrite)
    temps: list[tuple[Path, Path]] = []
    with contextlib.ExitStack() as dirs:
        try:
            for path, data in files.items():
                tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
                temps.append((tmp, path))
                with _disk_full_names(path):
                    dirs.enter_context(new_dirs(path.parent))
                    _write_data(tmp, data)
            with _disk_full_names(next(iter(files)).parent):
                _place_all(temps, overwrite)
        finally:
            for tmp, _ in temps:
                tmp.unlink(missing_ok=True)
    return [p for _, p in temps]


def move_all(staging: Path, out: Path, overwrite: bool = True) -> list[Path]:
    """Move every file of the directory `staging` into `out` all-or-nothing (same filesystem: a
    staging directory beside `out`)."""
    moves = [(f, out / f.name) for f in sorted(staging.iterdir()) if f.is_file()]
    check_destinations([dst for _, dst in moves], overwrite)
    with _disk_full_names(out), new_dirs(out):
        _place_all(moves, overwrite)
    return [dst for _, dst in moves]


def _place_all(temps: list[tuple[Path, Path]], overwrite: bool) -> None:
    """Give each temp its path, all or none. Without `overwrite`, by hard links, which refuse a path
    another process wrote since the check (OutputExistsError); where the file system refuses a hard
    link, by checking again and renaming."""
    if overwrite:
        _rename_all(temps)
    elif not _link_all(temps):
        check_destinations([path for _, path in temps], overwrite=False)
        _rename_all(temps)


def _link_all(temps: list[tuple[Path, Path]]) -> bool:
    """Link every temp to its path and remove the temps; False (nothing placed) where the file
    system refuses a link for any reason but an existing path: no hard links (EPERM, ENOTSUP,
    ENOSYS on sshfs and other FUSE mounts), a link limit (EMLINK), a mount boundary (EXDEV)."""
    linked: list[Path] = []
    try:
        for tmp, path in temps:
            try:
                os.link(tmp, path)
            except FileExistsError:
                raise _already_exists(path) from None
            except OSError:
                _unlink_all(linked)
                return False
            linked.append(path)
    except BaseException:
        _unlink_all(linked)
        raise
    _unlink_all([tmp for tmp, _ in temps])
    return True


@contextmanager
def new_dirs(path: Path) -> Iterator[None]:
    """Make the directory `path` and its missing parents for the block; when the block raises,
    remove those it made (where still empty), so that a failed write leaves no new empty dir."""
    path = Path(path).absolute()
    made = list(itertools.takewhile(lambda p: not p.exists(), (path, *path.parents)))    # deepest first
    try:
        path.mkdir(parents=True, exist_ok=True)
        yield
    except BaseException:
        for d in made:
            with contextlib.suppress(OSError):
                d.rmdir()
        raise


def _unlink_all(paths: list[Path]) -> None:
    for path in paths:
        with contextlib.suppress(OSError):
            path.unlink()


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


@contextmanager
def exclusive_lock(path: Path, wait: bool = True, remove: bool = False) -> Iterator[None]:
    """Hold flock(LOCK_EX) on `path` (created when missing; on Windows a byte-range lock, _byte_lock)
    for the block, against other processes that lock it. wait=False: BlockingIOError at once when
    another holds it. remove: delete the file before letting go (a lock file of our own; one that a
    waiter locked after the delete is noticed and retried on the new file)."""
    if fcntl is None:
        with _byte_lock(path, wait, remove, msvcrt.locking, msvcrt.LK_NBLCK, msvcrt.LK_UNLCK):
            yield
        return
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
            if _names_file(path, fd):
                break
        except BaseException:       # an interrupt while waiting included
            os.close(fd)
            raise
        os.close(fd)
    try:
        yield
    finally:
        if remove:
            with contextlib.suppress(OSError):
                os.unlink(path)
        os.close(fd)


def _names_file(path: Path, fd: int) -> bool:
    """`path` still names the open file `fd` (no lock holder deleted it meanwhile)."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return False
    own = os.fstat(fd)
    return (st.st_dev, st.st_ino) == (own.st_dev, own.st_ino)


# Windows' byte-range locks are mandatory: a lock on a byte of data (records.jsonl's first) would
# refuse our own append through another handle, and every reader. This one is far past any data.
_LOCK_BYTE = 1 << 40


@contextmanager
def _byte_lock(path: Path, wait: bool, remove: bool, locking, lock_mode: int,
               unlock_mode: int) -> Iterator[None]:
    """exclusive_lock by `locking(fd, mode, nbytes)`, which locks or unlocks bytes at the file's
    position without waiting, an OSError (EACCES) when another holds them: msvcrt.locking with
    LK_NBLCK/LK_UNLCK. A lock file cannot be deleted while open there, so it goes after the close,
    and not at all while a waiter has it open (that waiter then locks the file that stays)."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    try:
        os.lseek(fd, _LOCK_BYTE, os.SEEK_SET)
        while True:
            try:
                locking(fd, lock_mode, 1)
                break
            except OSError as e:
                if e.errno not in (errno.EACCES, errno.EAGAIN):
                    raise
                if not wait:
                    raise BlockingIOError(errno.EAGAIN, f"another process holds the lock on {path}") from None
            time.sleep(0.05)
    except BaseException:       # an interrupt while waiting included
        os.close(fd)
        raise
    try:
        yield
    finally:
        locking(fd, unlock_mode, 1)
        os.close(fd)
        if remove:
            with contextlib.suppress(OSError):
                os.unlink(path)

"""Writing a Hugging Face checkpoint: config.json + safetensors (sharded with an index when large)
written into a temp dir beside the target and renamed into place, so that neither a failure, a full
disk, a kill nor another process writing the same directory leaves a partial or mixed checkpoint.
A target that is a mount point (a Docker volume) cannot be renamed, so it is refused before any work:
a directory inside it can."""

from __future__ import annotations

import errno
import json
import os
import re
import secrets
import shutil
import tempfile
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import save_file

from salactl.errors import CheckpointError, OutputExistsError, OutputWriteError, SalactlError, UsageError
from salactl.reports.atomic import DISK_FULL_ERRNOS, free_space, write_remedy
from salactl.runtime.checkpoint import INDEX_NAME, SINGLE_NAME


def check_output_dir(out_dir: Path, overwrite: bool) -> Path:
    """The absolute checkpoint directory to write, or a one-line error before any work: an existing
    path needs `overwrite`, and even then only an empty directory or a checkpoint (config.json)
    is replaced, never the working directory or one above it; no parent may be a file, and neither
    it nor a directory above it a symlink to a missing target."""
    from salactl.out_dirs import directory_option

    given = Path(out_dir).expanduser()
    # before resolving: a symlink to a missing target resolves to that target, which reads as absent
    directory_option(given)                          # a file, a path below one, a dangling link: exit 2
    out_dir = given.resolve()
    if not out_dir.exists():
        return out_dir
    if out_dir.is_dir() and is_mount_point(out_dir):
        raise UsageError(f"--out {out_dir} is a mount point, which cannot be swapped for a new checkpoint in one "
                         f"rename; give a directory inside it, e.g. --out {out_dir / 'model'}")
    if not overwrite:
        raise OutputExistsError(f"{out_dir} already exists; choose another --out or pass --overwrite")
    cwd = Path.cwd().resolve()
    if out_dir == cwd or out_dir in cwd.parents:
        raise OutputExistsError(f"--overwrite would delete {out_dir}, which holds the working directory; "
                                "choose a new --out")
    if any(out_dir.iterdir()) and not (out_dir / "config.json").is_file():
        raise OutputExistsError(f"--overwrite only replaces a checkpoint, and {out_dir} has files but no "
                                "config.json; choose a new --out")
    return out_dir



def save_checkpoint(state: dict[str, torch.Tensor], config_dict: dict, out_dir: Path,
                    max_shard_bytes: int = 4 << 30, extra_files: dict[str, Path | bytes] | None = None,
                    overwrite: bool = False) -> Path:
    """Write config.json + safetensors (sharded with an index when large) into a temp dir next to
    `out_dir`, then rename: a failure never leaves a partial checkpoint. extra_files: name -> a file
    to copy, or the bytes to write. A disk that fills, or a
    file that cannot be written, is an OutputWriteError; one of `extra_files` that cannot be read,
    a CheckpointError; an `out_dir` another process wrote meanwhile, an OutputExistsError."""
    out_dir = check_output_dir(out_dir, overwrite)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    _remove_orphaned_temp_dirs(out_dir)
    tmp = Path(tempfile.mkdtemp(prefix=_temp_prefix(out_dir) + f"{os.getpid()}-", dir=out_dir.parent))
    try:
        try:
            _write_files(tmp, state, config_dict, max_shard_bytes, extra_files or {})
        except SafetensorError as e:                # safetensors' I/O errors are not OSErrors
            raise _disk_full(out_dir, str(e), _safetensors_remedy(e)) from e
        except OSError as e:
            raise _write_error(e, tmp, out_dir) from e
        _swap_into_place(tmp, out_dir, overwrite)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    _remove_orphaned_temp_dirs(out_dir)
    return out_dir


def _disk_full(out_dir: Path, cause: str, remedy: str) -> OutputWriteError:
    return OutputWriteError(f"cannot write the checkpoint {out_dir}: {cause}; {remedy}")


def _safetensors_remedy(e: SafetensorError) -> str:
    """By the errno that Rust's message carries ("... (os error 27)"); free space when it has none."""
    m = re.search(r"\(os error (\d+)\)", str(e))
    return write_remedy(OSError(int(m.group(1)), "")) if m else free_space()


def _write_error(e: OSError, tmp: Path, out_dir: Path) -> SalactlError:
    """`e`, raised while writing the checkpoint into `tmp`, as one line: a full disk says so; any
    other error names its file (as it will be in `out_dir`) and why, and a file copied in that
    cannot be read (a model directory's LICENSE without read permission) is the source's fault."""
    cause = e.strerror or str(e)
    if e.errno in DISK_FULL_ERRNOS:
        return _disk_full(out_dir, cause, write_remedy(e))
    name = Path(e.filename) if e.filename else tmp
    if name != tmp and tmp not in name.parents:
        return CheckpointError(f"cannot read {name}, to copy into the checkpoint: {cause}; make it a readable file")
    return OutputWriteError(f"cannot write {out_dir / name.relative_to(tmp)}: {cause}; choose another --out")


def _write_files(tmp: Path, state: dict[str, torch.Tensor], config_dict: dict, max_shard_bytes: int,
                 extra_files: dict[str, Path | bytes]) -> None:
    shards: list[dict[str, torch.Tensor]] = [{}]
    size = 0
    for name, t in state.items():
        nbytes = t.numel() * t.element_size()
        if shards[-1] and size + nbytes > max_shard_bytes:
            shards.append({})
            size = 0
        shards[-1][name] = t.detach().contiguous().cpu()
        size += nbytes
    meta = {"format": "pt"}
    if len(shards) == 1:
        save_file(shards[0], str(tmp / SINGLE_NAME), metadata=meta)
    else:
        weight_map, total = {}, 0
        for i, shard in enumerate(shards):
            fname = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
            save_file(shard, str(tmp / fname), metadata=meta)
            for n, t in shard.items():
                weight_map[n] = fname
                total += t.numel() * t.element_size()
        (tmp / INDEX_NAME).write_text(json.dumps(
            {"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2))
    (tmp / "config.json").write_text(json.dumps(config_dict, indent=2) + "\n")
    for fname, src in extra_files.items():
        if isinstance(src, bytes):
            (tmp / fname).write_bytes(src)
        else:
            shutil.copyfile(src, tmp / fname)
    # mkdtemp makes the directory 0700 and safetensors its files 0600: give them the modes a
    # plain write would (umask), so a server running as another user can read the checkpoint
    umask = os.umask(0)
    os.umask(umask)
    for f in tmp.iterdir():
        os.chmod(f, 0o666 & ~umask)
    os.chmod(tmp, 0o777 & ~umask)


def _temp_prefix(out_dir: Path) -> str:
    from salactl.out_dirs import short_name

    return f".{short_name(out_dir)}.tmp-"



def is_mount_point(path: Path) -> bool:
    """A mount point cannot be renamed (EBUSY): os.path.ismount, or on Linux a bind mount of a
    directory of the same file system, which only /proc/self/mountinfo tells."""
    if os.path.ismount(path):
        return True
    try:
        lines = Path("/proc/self/mountinfo").read_bytes().splitlines()
    except OSError:
        return False
    target = os.fsencode(Path(path).resolve())
    # field 5 is the mount point, with space, tab, newline and backslash escaped as octal
    octal = re.compile(rb"\\([0-7]{3})")
    return any(len(f) > 4 and octal.sub(lambda m: bytes([int(m[1], 8)]), f[4]) == target
               for f in map(bytes.split, lines))






def _remove_orphaned_temp_dirs(out_dir: Path) -> None:
    """Delete the temp dirs beside `out_dir` that a killed write left (SIGKILL runs no cleanup):
    those whose name carries the pid of a process no longer running. A live writer's stays; so does
    one whose pid was reused, until that process ends."""
    ours = re.compile(re.escape(_temp_prefix(out_dir)) + r"(\d+)-[a-z0-9_]{8}")   # mkdtemp's names only
    for leftover in out_dir.parent.iterdir():
        m = ours.fullmatch(leftover.name)
        if m and leftover.is_dir() and not _process_alive(int(m[1])):
            shutil.rmtree(leftover, ignore_errors=True)


def _process_alive(pid: int) -> bool:
    """False only when no process has this pid: another user's process, or a number too large to be
    a pid, counts as alive (its dir is left alone)."""
    if os.name == "nt":             # where os.kill(pid, 0) would end the process instead of probing it
        return _windows_process_alive(pid)
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError):
        pass
    return True


def _windows_process_alive(pid: int) -> bool:
    """OpenProcess fails with ERROR_INVALID_PARAMETER only for a pid no process has; any other failure
    (access denied: another user's process) counts as alive, and so does a process whose exit code
    is STILL_ACTIVE (one that ended returning 259 included)."""
    import ctypes
    from ctypes import wintypes

    if not 0 < pid <= 0xFFFFFFFF:
        return True
    kernel32 = ctypes.WinDLL("kernel32", use_last_error=True)
    kernel32.OpenProcess.restype = wintypes.HANDLE
    kernel32.OpenProcess.argtypes = (wintypes.DWORD, wintypes.BOOL, wintypes.DWORD)
    kernel32.GetExitCodeProcess.argtypes = (wintypes.HANDLE, ctypes.POINTER(wintypes.DWORD))
    kernel32.CloseHandle.argtypes = (wintypes.HANDLE,)
    handle = kernel32.OpenProcess(0x1000, False, pid)          # PROCESS_QUERY_LIMITED_INFORMATION
    if not handle:
        return ctypes.get_last_error() != 87                    # ERROR_INVALID_PARAMETER
    try:
        code = wintypes.DWORD()
        return not kernel32.GetExitCodeProcess(handle, ctypes.byref(code)) or code.value == 259
    finally:
        kernel32.CloseHandle(handle)


def _swap_into_place(new: Path, out_dir: Path, overwrite: bool) -> None:
    """Rename the finished checkpoint `new` onto `out_dir`. Without `overwrite` a checkpoint that
    another process put at out_dir since the check stays (OutputExistsError). With it, an existing
    out_dir is first renamed to a hidden backup beside it and deleted only once `new` is in place,
    so whatever stops this midway (Ctrl-C, a failed rename) leaves out_dir a whole checkpoint, the
    old or the new. Backups that an earlier run left behind (killed while deleting one) go with
    this run's; a running process's backup (a concurrent --overwrite) stays, named by its pid."""
    if not overwrite:
        _rename_unless_taken(new, out_dir, f"{out_dir} already exists: another process wrote it meanwhile; "
                                           "choose another --out or pass --overwrite")
        return
    # a name that no one else takes and that does not exist yet: Windows renames nothing onto a directory
    backup = out_dir.parent / f"{_backup_prefix(out_dir)}{os.getpid()}-{secrets.token_hex(4)}"
    try:
        try:
            os.replace(out_dir, backup)
        except FileNotFoundError:
            pass                # none, or another process's swap has it aside right now
        _rename_unless_taken(new, out_dir, f"another process wrote {out_dir} meanwhile, and its checkpoint "
                                           "stays; run again to replace it, or choose another --out")
    except BaseException:
        _undo_half_swap(backup, out_dir)
        raise
    # from here out_dir is the new checkpoint: the backup only goes, even when interrupted
    try:
        shutil.rmtree(backup, ignore_errors=True)
        _remove_leftover_backups(out_dir)
    except BaseException:
        shutil.rmtree(backup, ignore_errors=True)
        raise


def _undo_half_swap(backup: Path, out_dir: Path) -> None:
    """After an exception (Ctrl-C included) anywhere in the two renames, judged from the file system,
    since a signal lands after a rename returns and before any flag could record it: an untouched
    backup goes back where out_dir is missing, and is deleted only where out_dir holds a checkpoint
    again (the new one, or another process's). Otherwise it stays: it is the only copy."""
    if not os.path.lexists(backup):
        return
    if not os.path.lexists(out_dir):
        try:
            os.replace(backup, out_dir)
        except OSError:
            pass
    elif (out_dir / "config.json").is_file():
        shutil.rmtree(backup, ignore_errors=True)


def _remove_leftover_backups(out_dir: Path) -> None:
    # the names made above (8 hex digits) or by mkdtemp before them, nothing a user typed; a backup
    # named without a pid predates both, and one with this process's pid is an earlier, interrupted call's
    ours = re.compile(re.escape(_backup_prefix(out_dir)) + r"(?:(\d+)-)?[a-z0-9_]{8}")
    for leftover in out_dir.parent.iterdir():
        m = ours.fullmatch(leftover.name)
        if m and leftover.is_dir() and (m[1] is None or int(m[1]) == os.getpid() or not _process_alive(int(m[1]))):
            shutil.rmtree(leftover, ignore_errors=True)


def _backup_prefix(out_dir: Path) -> str:
    from salactl.out_dirs import short_name

    return f".{short_name(out_dir)}.old-"




def _rename_unless_taken(new: Path, out_dir: Path, taken: str) -> None:
    """Rename the directory `new` onto `out_dir`, which must be missing or empty: OutputExistsError
    (`taken`) when another process's checkpoint is there (a directory with files, or a file)."""
    try:
        os.replace(new, out_dir)
    except OSError as e:
        if e.errno in (errno.EEXIST, errno.ENOTEMPTY, errno.ENOTDIR):
            raise OutputExistsError(taken) from None
        raise

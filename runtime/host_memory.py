"""How much host memory a new allocation can have, for the checks that refuse what cannot fit (exit
11) instead of letting the kernel's OOM killer (or a failed mmap deep inside a library) end the
process with no message.

Three limits apply at once and the smallest wins: the machine's available memory, the memory
cgroup the process runs in (a container's `--memory`, a systemd slice or a batch job's limit, which
/proc/meminfo does not show: it reports the whole host), and the address-space limit (`ulimit -v`,
RLIMIT_AS), under which an allocation fails once the process's virtual size reaches it, whatever
memory is free. No library reads these together (psutil reports the host's memory only), so this
module does it by hand from the kernel's own files."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from salactl.errors import CapacityError

_UNLIMITED_CGROUP = 1 << 60     # cgroup v1 writes "no limit" as a page-rounded 2^63-1


def available_host_bytes(meminfo: Path = Path("/proc/meminfo"), proc: Path = Path("/proc/self"),
                         cgroup_root: Path = Path("/sys/fs/cgroup")) -> int | None:
    """The smallest of: the machine's available memory (MemAvailable from `meminfo` on Linux, the
    available physical memory on Windows, elsewhere (macOS) the total physical memory, an upper
    bound: macOS tells what is reclaimable only through vm_stat's page classes, a subprocess), what
    the process's memory cgroups leave it, and what RLIMIT_AS leaves of its address space. Every
    one counts reclaimable page cache as available, so a check refuses only what cannot fit. None
    where none of these can be read."""
    known = [limit for limit in (_machine_available(meminfo), _cgroup_available(proc, cgroup_root),
                                 _address_space_available(proc)) if limit is not None]
    return min(known) if known else None


def _machine_available(meminfo: Path) -> int | None:
    kib = _status_kib(meminfo, "MemAvailable:")
    if kib is not None:
        return kib * 1024
    if sys.platform == "win32":
        return _windows_available_bytes()
    try:
        total = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, OSError, ValueError):       # no sysconf, or not these names
        return None
    return total if total > 0 else None


def _windows_available_bytes() -> int | None:
    import ctypes

    class MemoryStatusEx(ctypes.Structure):
        _fields_ = [("dwLength", ctypes.c_uint32), ("dwMemoryLoad", ctypes.c_uint32),
                    *((name, ctypes.c_uint64) for name in ("ullTotalPhys", "ullAvailPhys", "ullTotalPageFile",
                                                           "ullAvailPageFile", "ullTotalVirtual",
                                                           "ullAvailVirtual", "ullAvailExtendedVirtual"))]

    status = MemoryStatusEx(dwLength=ctypes.sizeof(MemoryStatusEx))
    if not ctypes.windll.kernel32.GlobalMemoryStatusEx(ctypes.byref(status)):
        return None
    return status.ullAvailPhys


def _address_space_available(proc: Path) -> int | None:
    """RLIMIT_AS's soft limit less the process's virtual size (VmSize); None without a limit."""
    try:
        import resource
    except ImportError:                                   # Windows
        return None
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    if soft == resource.RLIM_INFINITY:
        return None
    size = _status_kib(proc / "status", "VmSize:")
    return None if size is None else max(0, soft - size * 1024)


def _status_kib(path: Path, key: str) -> int | None:
    try:
        for line in path.read_text().splitlines():
            if line.startswith(key):
                return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return None


def _cgroup_available(proc: Path, cgroup_root: Path) -> int | None:
    """The least headroom of the process's memory cgroup and its ancestors (a parent's limit binds
    its children too): limit - usage + the page cache the kernel reclaims before it OOM-kills.
    cgroup v2 (the unified hierarchy) and v1 (the `memory` controller); None without a limit."""
    try:
        lines = (proc / "cgroup").read_text().splitlines()
    except OSError:
        return None
    headrooms = []
    for line in lines:
        fields = line.split(":", 2)               # hierarchy-id:controllers:path
        if len(fields) != 3:
            continue
        _, controllers, path = fields
        if controllers == "":
            headrooms += _headrooms(cgroup_root, path, _v2_headroom)
        elif "memory" in controllers.split(","):
            headrooms += _headrooms(cgroup_root / "memory", path, _v1_headroom)
    known = [h for h in headrooms if h is not None]
    return min(known) if known else None


def _headrooms(mount: Path, path: str, headroom) -> list[int | None]:
    """`headroom` of every directory from the process's cgroup up to the mount's root. Inside a
    container the path may name the host's hierarchy, which the container's mount does not have:
    only the directories that exist count (the container's own root always does)."""
    parts = [part for part in path.strip("/").split("/") if part and part != ".."]
    dirs = [mount.joinpath(*parts[:depth]) for depth in range(len(parts), -1, -1)]
    return [headroom(d) for d in dirs if d.is_dir()]


def _read_int(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None         # "max" (v2's no limit) reads as None


def _stat(path: Path) -> dict[str, int]:
    try:
        pairs = (line.split() for line in path.read_text().splitlines())
        return {pair[0]: int(pair[1]) for pair in pairs if len(pair) == 2 and pair[1].isdigit()}
    except OSError:
        return {}


def _v2_headroom(d: Path) -> int | None:
    limit, usage = _read_int(d / "memory.max"), _read_int(d / "memory.current")
    if limit is None or usage is None:
        return None
    stat = _stat(d / "memory.stat")
    reclaimable = stat.get("file", 0) - stat.get("shmem", 0)   # shmem is "file" but cannot be dropped
    return max(0, limit - usage + max(0, reclaimable))


def _v1_headroom(d: Path) -> int | None:
    limit, usage = _read_int(d / "memory.limit_in_bytes"), _read_int(d / "memory.usage_in_bytes")
    if limit is None or usage is None or limit >= _UNLIMITED_CGROUP:
        return None
    stat = _stat(d / "memory.stat")
    reclaimable = stat.get("total_inactive_file", 0) + stat.get("total_active_file", 0)
    return max(0, limit - usage + reclaimable)


def check_fits(need: int, avail: int | None, what: str, where: str, fix: str) -> None:
    """A CapacityError (exit 11) before allocating, where `need` bytes exceed `avail` (None:
    unknown, no check): "{what} needs N, but {where} has M available; {fix}"."""
    from salactl.units import human_bytes

    if avail is not None and need > avail:
        raise CapacityError(f"{what} needs {human_bytes(need)}, but {where} has {human_bytes(avail)} "
                            f"available; {fix}")

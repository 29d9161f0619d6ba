"""Parse Nsight Compute's raw-page CSV export (`ncu --import R.ncu-rep --csv --page raw
--print-units base`) into one record per profiled kernel, with its NVTX push/pop stack.

Hand-written instead of `ncu_report`: that module exists only inside an ncu install, while the CSV
can be parsed anywhere (CI, a laptop) from a file copied off the GPU machine.

Layout: optional `==PROF==` log lines, a header row starting with "ID", a units row (empty ID),
then one row per kernel. The NVTX column ("thread Domain:Push/Pop_Range:PL_Type:...:Msg") holds the
thread id then one quoted `<domain>:<range>:<6 attribute fields>` entry per open range, outermost
first."""

from __future__ import annotations

import csv
import io
import re
from dataclasses import dataclass, field
from pathlib import Path

from salactl.errors import UsageError

TIME = "gpu__time_duration.sum"
DRAM_READ = "dram__bytes_read.sum"
DRAM_WRITE = "dram__bytes_write.sum"
SM_PCT = "sm__throughput.avg.pct_of_peak_sustained_elapsed"
MEM_PCT = "gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed"
DRAM_PCT = "dram__throughput.avg.pct_of_peak_sustained_elapsed"
REQUIRED = (TIME, DRAM_READ, DRAM_WRITE)

_SCALE = {"nsecond": 1e-9, "ns": 1e-9, "usecond": 1e-6, "us": 1e-6, "msecond": 1e-3, "ms": 1e-3,
          "second": 1.0, "s": 1.0, "byte": 1.0, "B": 1.0, "Kbyte": 1e3, "KB": 1e3, "Mbyte": 1e6,
          "MB": 1e6, "Gbyte": 1e9, "GB": 1e9, "Tbyte": 1e12, "KiB": 1024.0, "MiB": 1024.0 ** 2,
          "GiB": 1024.0 ** 3, "%": 1.0, "": 1.0}
_ENTRY = re.compile(r'"([^"]*)"')


@dataclass
class Kernel:
    id: int
    name: str
    nvtx: list[str]
    time_s: float
    dram_read: float
    dram_write: float
    sm_pct: float | None = None
    mem_pct: float | None = None
    dram_pct: float | None = None
    extra: dict = field(default_factory=dict)

    @property
    def dram_bytes(self) -> float:
        return self.dram_read + self.dram_write


def _number(text: str) -> float | None:
    t = text.strip().replace(",", "")
    if not t or t.lower() in ("n/a", "nan"):
        return None
    try:
        return float(t)
    except ValueError:
        return None


def parse_nvtx(cell: str) -> list[str]:
    """Range names of one NVTX push/pop cell, outermost first."""
    entries = _ENTRY.findall(cell)
    names = []
    for e in entries:
        parts = e.split(":")
        names.append(":".join(parts[1:-6]) if len(parts) >= 8 else parts[-1])
    return names


def parse_csv_text(text: str, source: str = "ncu CSV") -> list[Kernel]:
    lines = text.splitlines()
    start = next((i for i, ln in enumerate(lines) if ln.startswith('"ID"')), None)
    if start is None:
        raise UsageError(f"{source} has no kernel table (no header row starting with \"ID\"); "
                         "export it with: ncu --import R.ncu-rep --csv --page raw --print-units base")
    rows = list(csv.reader(io.StringIO("\n".join(lines[start:]))))
    header = rows[0]
    col = {h: i for i, h in enumerate(header)}
    missing = [m for m in ("Kernel Name", *REQUIRED) if m not in col]
    if missing:
        raise UsageError(f"{source} lacks columns {missing}; profile with --metrics "
                         f"{','.join(REQUIRED)}")
    body = rows[1:]
    units = [""] * len(header)
    if body and not body[0][col["ID"]].strip():
        units, body = body[0], body[1:]
    nvtx_col = next((i for i, h in enumerate(header) if "Push/Pop_Range" in h), None)

    def value(row, metric) -> float | None:
        i = col.get(metric)
        if i is None or i >= len(row):
            return None
        v = _number(row[i])
        u = units[i].strip() if i < len(units) else ""
        if v is None:
            return None
        if u not in _SCALE:
            raise UsageError(f"{source}: unknown unit {u!r} for {metric}; export with --print-units base")
        return v * _SCALE[u]

    kernels = []
    for row in body:
        if len(row) < len(header) or not row[col["ID"]].strip():
            continue
        t, r, w = (value(row, m) for m in REQUIRED)
        if t is None:
            continue
        kernels.append(Kernel(
            id=int(_number(row[col["ID"]]) or 0), name=row[col["Kernel Name"]],
            nvtx=parse_nvtx(row[nvtx_col]) if nvtx_col is not None else [],
            time_s=t, dram_read=r or 0.0, dram_write=w or 0.0,
            sm_pct=value(row, SM_PCT), mem_pct=value(row, MEM_PCT), dram_pct=value(row, DRAM_PCT)))
    if not kernels:
        raise UsageError(f"{source} holds no profiled kernels")
    return kernels


def parse_csv(path: Path) -> list[Kernel]:
    try:
        text = Path(path).read_text(encoding="utf-8-sig")
    except OSError as e:
        raise UsageError(f"cannot read ncu CSV {path}: {e.strerror}") from None
    return parse_csv_text(text, str(path))

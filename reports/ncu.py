"""Parse Nsight Compute's raw-page CSV export (`ncu --import R.ncu-rep --csv --page raw
--print-units base`) into one record per profiled kernel, with its NVTX push/pop stack.

Hand-written instead of `ncu_report`: that module exists only inside an ncu install, while the CSV
can be parsed anywhere (CI, a laptop) from a file copied off the GPU machine.

Layout: optional `==PROF==` log lines, a header row starting with "ID", a units row (empty ID),
then one row per kernel; ncu's own `==PROF==`/`==WARNING==` lines may sit among them. The NVTX
column ("thread Domain:Push/Pop_Range:PL_Type:...:Msg") holds the thread id then one quoted
`<domain>:<range>:<6 attribute fields>` entry per open range, outermost first."""

from __future__ import annotations

import csv
import io
import math
import re
from dataclasses import dataclass, field
from pathlib import Path

from salactl.errors import UsageError
from salactl.output import warn_once
from salactl.runtime.json_file import check_regular_file

TIME = "gpu__time_duration.sum"
DRAM_READ = "dram__bytes_read.sum"
DRAM_WRITE = "dram__bytes_write.sum"
SM_PCT = "sm__throughput.avg.pct_of_peak_sustained_elapsed"
MEM_PCT = "gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed"
DRAM_PCT = "dram__throughput.avg.pct_of_peak_sustained_elapsed"
REQUIRED = (TIME, DRAM_READ, DRAM_WRITE)
GZIP_MAGIC = b"\x1f\x8b"          # a file compressed to be copied off the GPU machine
EXPORT_HINT = "export it with: ncu --import R.ncu-rep --csv --page raw --print-units base"

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
    dram_read: float | None         # None: ncu wrote n/a (no counter value for this kernel)
    dram_write: float | None
    sm_pct: float | None = None
    mem_pct: float | None = None
    dram_pct: float | None = None
    extra: dict = field(default_factory=dict)

    @property
    def dram_bytes(self) -> float | None:
        if self.dram_read is None or self.dram_write is None:
            return None
        return self.dram_read + self.dram_write


def _kernel_id(cell: str) -> int | None:
    """A kernel row's ID (a whole number), else None."""
    t = cell.strip().replace(",", "")
    return int(t) if t.isascii() and t.isdigit() else None


def _metric(row: list[str], i: int, metric: str, scale: float, source: str, hint: str) -> float | None:
    """`metric` of one kernel row in base units; None where ncu wrote no value (empty or n/a; nan or
    inf too for a percentage, a ratio that may divide by zero). A time or byte count that is not a
    finite non-negative number is a usage error naming the row, the metric and the cell."""
    cell = row[i]
    t = cell.strip().replace(",", "")
    if not t or t.lower() == "n/a":
        return None
    try:
        v = float(t) * scale
    except ValueError:
        v = None
    if v is not None and not math.isfinite(v) and metric not in REQUIRED:
        return None
    if v is None or not math.isfinite(v) or v < 0:
        raise UsageError(f"{source}: kernel row {row[0].strip()} has {metric} {cell!r}, not a finite "
                         f"non-negative number; {hint}")
    return v


def parse_nvtx(cell: str) -> list[str]:
    """Range names of one NVTX push/pop cell, outermost first."""
    entries = _ENTRY.findall(cell)
    names = []
    for e in entries:
        parts = e.split(":")
        names.append(":".join(parts[1:-6]) if len(parts) >= 8 else parts[-1])
    return names


def parse_csv_text(text: str, source: str = "ncu CSV", hint: str = EXPORT_HINT) -> list[Kernel]:
    """Kernels of an export; a kernel without a time (n/a) is left out and one without DRAM bytes
    kept with None, each counted in a warning. A table cut short (an interrupted export or copy) is
    refused, not read as the kernels before the cut, and so is a time or byte count that is no
    finite non-negative number. `hint` ends the errors about the export's form."""
    header, units, body = _table(text, source, hint)
    col = {h: i for i, h in enumerate(header)}
    nvtx_col = next((i for i, h in enumerate(header) if "Push/Pop_Range" in h), None)
    scale = {m: _scale(units, col[m], m, source, hint)
             for m in (*REQUIRED, SM_PCT, MEM_PCT, DRAM_PCT) if m in col}

    def value(row, metric) -> float | None:
        return _metric(row, col[metric], metric, scale[metric], source, hint) if metric in col else None

    kernels, untimed = [], 0
    for row in body:
        kernel_id = _kernel_id(row[0])
        if kernel_id is None:
            raise UsageError(f"{source} has a kernel row whose ID {row[0]!r} is not a whole number; {hint}")
        t, r, w = (value(row, m) for m in REQUIRED)
        if t is None:
            untimed += 1
            continue
        kernels.append(Kernel(
            id=kernel_id, name=row[col["Kernel Name"]],
            nvtx=parse_nvtx(row[nvtx_col]) if nvtx_col is not None else [],
            time_s=t, dram_read=r, dram_write=w,
            sm_pct=value(row, SM_PCT), mem_pct=value(row, MEM_PCT), dram_pct=value(row, DRAM_PCT)))
    if not kernels:
        raise UsageError(f"{source} holds no profiled kernels" +
                         (f" with a time ({untimed} have n/a)" if untimed else "") +
                         "; capture the step again with salactl profile --ncu")
    _warn_missing(source, len(body), untimed, sum(k.dram_bytes is None for k in kernels))
    return kernels


def _table(text: str, source: str, hint: str) -> tuple[list[str], list[str], list[list[str]]]:
    """(header, units, kernel rows) of the export: blank lines and ncu's `==` log lines dropped."""
    lines = text.splitlines()
    start = next((i for i, ln in enumerate(lines) if ln.startswith('"ID"')), None)
    if start is None:
        raise UsageError(f"{source} has no kernel table (no header row starting with \"ID\"); {hint}")
    try:
        rows = [r for r in csv.reader(io.StringIO("\n".join(lines[start:])))
                if any(c.strip() for c in r) and not r[0].startswith("==")]
    except csv.Error as e:
        raise UsageError(f"{source} is not a CSV table ({e}); {hint}") from None
    header, body = rows[0], rows[1:]
    missing = [m for m in ("Kernel Name", *REQUIRED) if m not in header]
    if missing:
        raise UsageError(f"{source} lacks columns {missing}; profile with --metrics {','.join(REQUIRED)}")
    if not body or body[0][0].strip():
        raise UsageError(f"{source} has no units row after its header (ncu writes one); {hint}")
    units, body = body[0], body[1:]
    last = next(ln for ln in reversed(lines) if ln.strip())
    table_last = not last.startswith("==")
    if table_last and last.count('"') % 2:     # every cell is quoted: a cut one is open
        raise UsageError(f"{source} is cut short inside its last row; {hint}")
    short = next((r for r in body if len(r) < len(header) and _kernel_id(r[0]) is not None), None)
    if short is not None:
        raise UsageError(f"{source} is cut short: kernel row {short[0]} has {len(short)} of {len(header)} "
                         f"columns; {hint}")
    # ncu ends every row with a line end: a row without one was cut after a cell (maybe the last
    # one's closing quote, or the comma before an empty-looking last cell). A cut just after a line
    # end cannot be told from a shorter capture (--launch-count), so it is read.
    if table_last and text.rstrip(" \t")[-1:] not in ("\n", "\r"):
        raise UsageError(f"{source} is cut short: its last row has no line end (ncu ends every row with one); "
                         f"{hint}")
    return header, units, [r for r in body if len(r) >= len(header) and r[0].strip()]


def _scale(units: list[str], i: int, metric: str, source: str, hint: str) -> float:
    u = units[i].strip() if i < len(units) else ""
    if not u and metric in REQUIRED:      # a bare number of what: ns or us, bytes or KB?
        raise UsageError(f"{source} gives no unit for {metric} in its units row; {hint}")
    if u not in _SCALE:
        raise UsageError(f"{source}: unknown unit {u!r} for {metric}; export with --print-units base")
    return _SCALE[u]


def _warn_missing(source: str, total: int, untimed: int, no_bytes: int) -> None:
    if untimed:
        warn_once(f"{source}: {untimed} of {total} kernels have no time (n/a) and are left out of every table")
    if no_bytes:
        warn_once(f"{source}: {no_bytes} of {total} kernels have no DRAM bytes (n/a): their kernel rows, "
                  "and the op and layer rows holding them, show '-' bytes")


def parse_csv(path: Path, source: str | None = None, hint: str = EXPORT_HINT) -> list[Kernel]:
    """The kernels of an export file; `source` names it in errors (default: its path)."""
    source = source or str(path)
    try:
        check_regular_file(Path(path), UsageError, 1 << 62, hint)      # a FIFO would block the read
        data = Path(path).read_bytes()
    except OSError as e:
        raise UsageError(f"cannot read ncu CSV {path}: {e.strerror or e}") from None
    if data.startswith(GZIP_MAGIC):
        raise UsageError(f"{source} is gzip-compressed; gunzip it first")
    try:
        # not "utf-8-sig": its decode errors count bytes from after the mark
        text = data.decode("utf-8").removeprefix("\ufeff")
    except UnicodeDecodeError as e:
        raise UsageError(f"{source} is not UTF-8 text ({e.reason} at byte offset {e.start}), so not an ncu CSV export; "
                         f"{hint}") from None
    return parse_csv_text(text, source, hint)

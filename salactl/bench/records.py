"""Run records: one flat JSON object per (run, phase), appended to `records.jsonl` as soon as the
phase finishes (so Ctrl-C keeps every finished phase), plus the per-request CSV (`--details`)
written whole through a temp file. Schema version 1 (DESIGN.md §4):

    schema_version, kind ("bench" | "sweep" | "run"), run_id, label, profile, phase, target
    ("embedded" | "sglang" | "openai"), model, timestamp, <metric fields with SGLang names>,
    knobs {every setting that produced it}, env (salactl.env.environment())
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import signal
import threading
import time
from datetime import datetime, timezone
from pathlib import Path

from salactl import input_files, output
from salactl.bench.requests import RequestResult
from salactl.errors import OutputWriteError, UsageError
from salactl.output import jsonable
from salactl.reports.atomic import exclusive_lock, new_dirs, write_atomic, write_remedy
from salactl.reports.records import RECORDS_NAME  # noqa: F401 - bench.records.RECORDS_NAME for its writers
from salactl.reports.records import SCHEMA_VERSION, breaks_lines, parse_record_line, record_lines
from salactl.reports.text_cells import csv_rows

DETAIL_COLUMNS = ("run_id", "phase", "request_id", "input_len", "expected_output_len", "output_len",
                  "success", "start_offset_s", "ttft_ms", "tpot_ms", "e2e_ms", "itl_ms", "error")


def new_run_id() -> str:
    return datetime.now().strftime("%Y%m%dT%H%M%S") + "-" + secrets.token_hex(2)


def make_record(kind: str, run_id: str, label: str | None, profile: str, phase: str, target: str,
                model: str, metrics: dict, knobs: dict, env: dict, wall_time: float | None = None) -> dict:
    rec = {"schema_version": SCHEMA_VERSION, "kind": kind, "run_id": run_id, "label": label,
           "profile": profile, "phase": phase, "target": target, "model": model,
           "timestamp": datetime.fromtimestamp(wall_time or time.time(), timezone.utc).isoformat()}
    rec.update(metrics)
    rec["knobs"] = knobs
    rec["env"] = env
    return jsonable(rec)


def check_label(label: str | None) -> str | None:
    """A --label for the records, as given: one holding a control character or line separator (a line
    break would split the report's headings and table rows), or a lone surrogate (a byte that is not
    UTF-8, as Python decodes it from the command line; no UTF-8 file can hold it), is a UsageError; so
    is an empty or blank one, which names the run as nothing (other text options refuse empty text too)."""
    if label is not None:
        if not label.strip():
            raise UsageError("--label is empty; give a name for the records, or drop --label")
        bad = next((c for c in label if breaks_lines(c)), None)
        if bad is not None:
            raise UsageError(f"--label {label!r} holds the control character {bad!r}; give a name without "
                             "control characters or line breaks")
        if input_files.lone_surrogate(label):
            raise UsageError(f"--label {label!r} is not valid UTF-8; give the name in UTF-8")
    return label


INTERRUPT_SIGNALS = (signal.SIGINT, signal.SIGTERM)
_undeferred: dict[int, object] = {}     # while interrupts are deferred: the handlers the outermost block replaced


@contextlib.contextmanager
def interrupts_deferred():
    """Hold Ctrl-C and SIGTERM until the block ends, then deliver the first one through the handler
    that was in place (KeyboardInterrupt, cli.Terminated): a record appended and registered in the
    run inside the block is either both or neither, so the cleanup the interrupt runs writes the
    summaries of exactly the records on disk. Only the main thread handles signals; elsewhere the
    block runs as it is. `interrupts_let_through` reopens it for a wait."""
    if threading.current_thread() is not threading.main_thread() or \
            any(signal.getsignal(sig) is None for sig in INTERRUPT_SIGNALS):    # a handler set outside Python
        yield
        return
    pending: list[int] = []
    previous = {}
    outermost = not _undeferred
    try:
        for sig in INTERRUPT_SIGNALS:
            previous[sig] = signal.signal(sig, lambda signum, frame: pending.append(signum))
        if outermost:
            _undeferred.update(previous)
        yield
    finally:
        # both restored before either can fire: one arriving between the two restores would raise
        # out of this loop and leave the other signal on the dead `pending` list for good
        masks = hasattr(signal, "pthread_sigmask")          # POSIX only
        mask = signal.pthread_sigmask(signal.SIG_BLOCK, INTERRUPT_SIGNALS) if masks else None
        try:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            if outermost:
                _undeferred.clear()
        finally:
            if masks:
                signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        if pending:
            _deliver(pending[0], previous[pending[0]])


@contextlib.contextmanager
def interrupts_let_through():
    """Inside interrupts_deferred blocks, a block that Ctrl-C and SIGTERM end at once through the
    handlers in place before the deferral: a wait that changes nothing, such as for another
    process's lock. A signal deferred before the block stays deferred."""
    if not _undeferred or threading.current_thread() is not threading.main_thread():
        yield
        return
    deferring = {sig: signal.signal(sig, handler) for sig, handler in _undeferred.items()}
    try:
        yield
    finally:
        for sig, handler in deferring.items():
            signal.signal(sig, handler)


def _deliver(signum: int, handler) -> None:
    if callable(handler):
        handler(signum, None)
    elif handler == signal.SIG_DFL:
        signal.raise_signal(signum)


class RecordWriter:
    """Appends whole lines (one write + fsync per call, under an exclusive lock on the file) so
    neither a crash, a full disk nor another process's append leaves half a record. A file that ends
    in a partial line (cut short by something else) gets a line break first, so the new records do
    not run into the fragment, which stays a damaged line of its own."""

    def __init__(self, path: Path):
        self.path = Path(path)

    def append(self, record: dict) -> None:
        self.extend([record])

    def extend(self, records: list[dict]) -> None:
        """`records` in one write that no interrupt splits: run's prefill and decode records go
        together (an interrupt while another process holds the lock ends the wait, with nothing
        written). A write that fails (disk full) is taken back whole, a file or directory it began
        removed: an OutputWriteError."""
        text = "".join(json.dumps(record, sort_keys=False) + "\n" for record in records)
        try:
            with contextlib.ExitStack() as stack:
                stack.enter_context(new_dirs(self.path.parent))
                with interrupts_let_through():      # Ctrl-C ends a wait on another process's append
                    stack.enter_context(exclusive_lock(self.path))
                stack.enter_context(interrupts_deferred())
                f = stack.enter_context(open(self.path, "a+b", buffering=0))
                size = f.seek(0, os.SEEK_END)
                if _ends_in_partial_line(f, size):
                    fragment_line = len(re.findall(rb"\r\n|\r|\n", self.path.read_bytes())) + 1
                    output.warn_once(f"{self.path} ends in a partial line (line {fragment_line}, a damaged "
                                     "record); the new records start on the next line")
                    text = "\n" + text
                try:
                    _write_all(f, text.encode("utf-8"))
                    os.fsync(f.fileno())
                except OSError:
                    with contextlib.suppress(OSError):
                        if size:
                            f.truncate(size)
                        else:       # a file this write began (or an empty one): none left behind
                            self.path.unlink()
                    raise
        except OSError as e:
            raise OutputWriteError(f"cannot append to {self.path}: {e.strerror or e}; {write_remedy(e)}") from e


def _ends_in_partial_line(f, size: int) -> bool:
    """`f` (opened "a+b", `size` bytes long) is not empty and its last byte is not a line break."""
    if size == 0:
        return False
    f.seek(size - 1)
    return f.read(1) not in (b"\n", b"\r")        # a CR-only file ends its lines in \r


def _write_all(f, data: bytes) -> None:
    """An unbuffered file's write may take only part of `data` (a file-size limit reached midway)."""
    view = memoryview(data)
    while view:
        view = view[f.write(view):]


def read_records(path: Path) -> list[dict]:
    """The records already in `path` ([] when there is none), skipping lines that hold no JSON object
    with one warning; a file that is not a regular file, cannot be read or is not UTF-8 is a
    UsageError (exit 2): it is the --out of this command."""
    path = Path(path)
    if not path.exists():
        return []
    out = []
    damaged = []
    for lineno, line in record_lines(path, UsageError, "move it away or choose another --out", regular_only=True):
        if line.strip():
            record = parse_record_line(line)
            if isinstance(record, dict):
                out.append(record)
            else:
                damaged.append(lineno)      # a foreign or damaged line; records are written whole
    if damaged:
        output.warn_once(f"skipped {len(damaged)} damaged line(s) of {path} (first: line {damaged[0]}); "
                         "a point recorded there counts as not measured")
    return out


def detail_rows(run_id: str, results: list[RequestResult], t0: float) -> list[list]:
    rows = []
    for r in results:
        tpot = r.tpot
        rows.append([run_id, r.phase, r.request_id, r.input_len, r.expected_output_len, r.output_len,
                     int(r.success), round(r.start_time - t0, 6),
                     round(r.ttft * 1e3, 4) if r.success else "",
                     "" if tpot is None else round(tpot * 1e3, 4),
                     round(r.latency * 1e3, 4) if r.success else "",
                     json.dumps([round(x * 1e3, 4) for x in r.itl]) if r.success else "",
                     r.error.splitlines()[0] if r.error else ""])
    return rows


def write_details(path: Path, rows: list[list]) -> None:

    write_atomic(path, csv_rows([DETAIL_COLUMNS, *rows]))

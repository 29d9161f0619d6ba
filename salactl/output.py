"""Output conventions: data on stdout (JSON or rich tables), everything else on stderr."""

from __future__ import annotations

import errno
import json
import math
import os
import sys
from pathlib import PurePath

from rich.console import Console
from rich.measure import Measurement
from rich.table import Table

from salactl.input_files import utf8_text
from salactl.units import fmt_float


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
        return fmt_float(v)
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

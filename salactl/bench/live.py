"""Live progress on stderr (rich): one bar per phase with completed / failed requests and tokens."""

from __future__ import annotations

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from salactl import output
from salactl.bench.threads import start_thread

CONCURRENCY_FIX = "lower the phases' max_concurrency"


def _start(progress: Progress) -> None:
    """Start the bar's refresh thread; one this machine cannot start is a CapacityError, with the
    display (which already redirects stderr) undone first."""
    def start():
        try:
            progress.start()
        except RuntimeError:
            progress.live.auto_refresh = False      # its refresh thread never ran: nothing to join
            progress.stop()
            raise
    start_thread(start, "progress bar's refresh thread", CONCURRENCY_FIX)


class RichProgress:
    def __init__(self):
        self.progress = Progress(TextColumn("[bold]{task.fields[phase]}"), BarColumn(), MofNCompleteColumn(),
                                 TextColumn("{task.fields[info]}"), TimeElapsedColumn(),
                                 console=output.stderr, transient=False)
        self.task = None
        self.failed = self.tokens = 0

    def begin(self, name: str, total: int) -> None:
        self.failed = self.tokens = 0
        if self.task is None:
            _start(self.progress)
        self.task = self.progress.add_task("", total=total, phase=name, info="")

    def advance(self, result) -> None:
        self.failed += 0 if result.success else 1
        self.tokens += result.output_len
        info = f"{self.tokens} tok" + (f", {self.failed} failed" if self.failed else "")
        self.progress.update(self.task, advance=1, info=info)

    def end(self) -> None:
        pass

    def close(self) -> None:
        if self.task is not None:
            self.progress.stop()


class PointProgress:
    """One bar over the sweep's points."""

    def __init__(self):
        self.progress = Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                                 TimeElapsedColumn(), console=output.stderr, transient=False)
        self.task = None

    def begin(self, name: str, total: int) -> None:
        _start(self.progress)
        self.task = self.progress.add_task(name, total=total)

    def advance_point(self) -> None:
        self.progress.update(self.task, advance=1)

    def end(self) -> None:
        self.progress.stop()

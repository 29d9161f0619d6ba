"""What the runner needs from a target: stream one request as (timestamp, cumulative completion
tokens) chunks, flush the prefix cache, and report per-phase device figures."""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Iterator

from salactl.bench.requests import BenchRequest


@dataclass(frozen=True)
class Chunk:
    timestamp: float            # time.perf_counter() when the chunk reached the client
    completion_tokens: int      # tokens generated so far (cumulative)
    counts_only: bool = False   # a final usage report: corrects the count, carries no timing
    # counts_only: who counted a total that replaces the running count even when lower: "usage" (the
    # server's last report, no estimate), or the client's own count (the server sent no usage):
    # "tokenizer" or "chunks"
    counted_by: str | None = None
    over_max: int | None = None  # that estimate before it was capped at max_tokens, when it was above


class RequestFailed(Exception):
    """One request failed (HTTP error, server error, engine error): counted in `failed`."""


class Target(ABC):
    kind: str = ""                      # "embedded" | "sglang" | "openai" (the record's `target`)
    count_source: str = "engine"        # who counts output tokens when nothing is estimated
    model: str = ""
    max_batch_size: int | None = None   # how many requests it runs at once (None = no known limit)
    tokenizer = None                    # counts output a server reports no usage for (HTTP targets)

    def check(self) -> None:
        """Fail fast (SalactlError) when the target cannot serve at all."""

    @abstractmethod
    def stream(self, request: BenchRequest, max_tokens: int, cancel: threading.Event) -> Iterator[Chunk]:
        """Send one request (ignore_eos, temperature 0, exactly max_tokens new tokens) and yield
        chunks as they arrive; raise RequestFailed on a per-request failure."""

    def flush_cache(self) -> bool:
        """Drop any prefix cache so a phase does not reuse the warmup's work; False when that failed."""
        return True

    def prepare(self, max_concurrency: int, first_position: int, last_position: int) -> None:
        """Before the clock: build what the target would otherwise build lazily inside the timed phase
        for decode steps of up to max_concurrency requests feeding positions in [first_position,
        last_position] (a request's first decode step feeds position input_len, its last
        input_len + output_len - 2)."""

    def cancel_all(self) -> None:
        """Unblock every in-flight stream (Ctrl-C)."""

    def phase_begin(self) -> None:
        """Called right before a timed phase starts (e.g. reset GPU memory peaks)."""

    def phase_end(self, output_tokens: int) -> dict:
        """Device figures for the phase just finished (peak memory, energy); {} if unknown."""
        return {}

    def knobs(self) -> dict:
        return {}

    def close(self) -> None:
        pass

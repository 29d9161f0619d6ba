"""A streaming front for the single-sequence `runtime.engine.Engine`: one worker thread serves
submitted requests one at a time in FIFO order and streams (token_id, timestamp) back.

This is the `StreamingEngine` interface the embedded bench target drives; the continuous-batching
GPU engine plugs in by implementing the same `submit` (and a larger `max_batch_size`). Because
requests wait for the worker, queueing time shows up in TTFT (and duration) exactly as a server
that does not batch would show it to SGLang's client."""

from __future__ import annotations

import queue
import threading
import time
from typing import Iterator, Protocol

from salactl.runtime.sampling import SamplingParams

_END = object()


class StreamingEngine(Protocol):
    max_batch_size: int

    def submit(self, prompt_ids: list[int], params: SamplingParams,
               cancel: threading.Event) -> Iterator[tuple[int, float]]:
        """Queue a request; iterate (token_id, perf_counter timestamp) as tokens are produced."""

    def close(self) -> None: ...


class _Job:
    def __init__(self, prompt_ids, params, cancel):
        self.prompt_ids, self.params, self.cancel = prompt_ids, params, cancel
        self.out: queue.Queue = queue.Queue()


class FifoEngine:
    max_batch_size = 1

    def __init__(self, engine, eos_ids: tuple[int, ...] = ()):
        self.engine, self.eos_ids = engine, eos_ids
        self._jobs: queue.Queue = queue.Queue()
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._work, name="salactl-bench-engine", daemon=True)
        self._thread.start()

    def submit(self, prompt_ids, params, cancel) -> Iterator[tuple[int, float]]:
        job = _Job(list(prompt_ids), params, cancel)
        self._jobs.put(job)
        return self._drain(job)

    @staticmethod
    def _drain(job: _Job) -> Iterator[tuple[int, float]]:
        while True:
            item = job.out.get()
            if item is _END:
                return
            if isinstance(item, BaseException):
                raise item
            yield item

    def _work(self) -> None:
        while not self._closed.is_set():
            try:
                job = self._jobs.get(timeout=0.1)
            except queue.Empty:
                continue
            try:
                if not job.cancel.is_set():
                    for tok in self.engine.stream(job.prompt_ids, job.params, self.eos_ids):
                        job.out.put((tok, time.perf_counter()))
                        if job.cancel.is_set() or self._closed.is_set():
                            break
            except Exception as e:  # delivered to the waiting client as a failed request
                job.out.put(e)
            job.out.put(_END)
        while True:                     # closed: release every client still waiting
            try:
                job = self._jobs.get_nowait()
            except queue.Empty:
                return
            job.out.put(RuntimeError("the engine was closed before this request ran"))

    def close(self) -> None:
        self._closed.set()

"""Drive an in-process engine from many client threads: the `EngineDriver` the embedded bench
target talks to (`submit(prompt_ids, params, cancel)` -> iterator of (token_id, timestamp)).

One worker thread owns a *stepping* engine — `submit(prompt, params) -> rid`, `step() ->
[(rid, token_or_exception, perf_counter)]`, `has_work()`, `is_finished(rid)`, `release(rid)`
(stop it if still running and forget it) — and routes each produced token to the client waiting
for it. Two stepping engines exist:
- `SerialStepper`: the single-sequence `runtime.engine.Engine`, one request at a time in FIFO
  order (max batch 1). Requests queue behind the running one, so queueing time shows up in TTFT
  and duration, exactly as a non-batching server would show it to SGLang's client.
- `GpuStepper`: the continuous-batching `runtime.gpu.engine.GPUEngine` (its own submit/step).
"""

from __future__ import annotations

import queue
import sys
import threading
import time
from collections import deque
from typing import Iterator

from salactl.runtime.sampling import SamplingParams

_END = object()


class SerialStepper:
    """FIFO over `Engine.stream`: each step yields the next token of the oldest request."""

    max_batch_size = 1

    def __init__(self, engine):
        self.engine = engine
        self.waiting: deque = deque()
        self.current = None                 # (rid, generator)
        self.done: set[int] = set()
        self._next = 0

    def submit(self, prompt_ids: list[int], params: SamplingParams) -> int:
        rid, self._next = self._next, self._next + 1
        self.waiting.append((rid, prompt_ids, params))
        return rid

    def has_work(self) -> bool:
        return self.current is not None or bool(self.waiting)

    def is_finished(self, rid: int) -> bool:
        return rid in self.done

    def release(self, rid: int) -> None:
        self.waiting = deque(w for w in self.waiting if w[0] != rid)
        if self.current is not None and self.current[0] == rid:
            self.current = None
        self.done.discard(rid)

    def step(self) -> list[tuple[int, object, float]]:
        if self.current is None:
            rid, prompt, params = self.waiting.popleft()
            try:
                self.current = (rid, self.engine.stream(prompt, params))
            except Exception as e:  # refused at submission (stream checks eagerly): this one fails
                self.done.add(rid)
                return [(rid, e, time.perf_counter())]
        rid, gen = self.current
        try:
            tok = next(gen)
        except StopIteration:
            self.current = None
            self.done.add(rid)
            return []
        except Exception as e:      # this request fails; the queue goes on
            self.current = None
            self.done.add(rid)
            return [(rid, e, time.perf_counter())]
        return [(rid, tok, time.perf_counter())]


class GpuStepper:
    """`GPUEngine` speaks the stepping protocol almost natively."""

    def __init__(self, engine):
        self.engine = engine
        self.max_batch_size = engine.scheduler.max_running if hasattr(engine.scheduler, "max_running") else None

    def submit(self, prompt_ids, params) -> int:
        return self.engine.submit(prompt_ids, params)

    def has_work(self) -> bool:
        return self.engine.scheduler.has_work()

    def is_finished(self, rid: int) -> bool:
        return self.engine.requests[rid].finish_reason is not None

    def release(self, rid: int) -> None:
        self.engine.abort(rid)              # frees its slot and pages for the requests behind it
        self.engine.result(rid)             # and the engine's record of it

    def step(self):
        return self.engine.step()

    def prepare(self, rows: int, first_position: int, last_position: int) -> None:
        self.engine.capture_decode_graphs(rows, first_position, last_position)


class _Job:
    def __init__(self, prompt_ids, params, cancel):
        self.prompt_ids, self.params, self.cancel = prompt_ids, params, cancel
        self.out: queue.Queue = queue.Queue()


class EngineDriver:
    def __init__(self, stepper, max_batch_size: int | None = None):
        self.stepper = stepper
        self.max_batch_size = max_batch_size or getattr(stepper, "max_batch_size", None)
        self._inbox: queue.Queue = queue.Queue()
        self._jobs: dict[int, _Job] = {}
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._work, name="salactl-bench-engine", daemon=True)
        self._thread.start()

    def submit(self, prompt_ids, params, cancel) -> Iterator[tuple[int, float]]:
        if self._closed.is_set():
            raise RuntimeError("the engine driver is closed; build a new target to submit requests")
        job = _Job(list(prompt_ids), params, cancel)
        self._inbox.put(job)
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

    def _admit(self, block: bool) -> None:
        while True:
            try:
                job = self._inbox.get(timeout=0.05) if block else self._inbox.get_nowait()
            except queue.Empty:
                return
            block = False
            if job.cancel.is_set():
                job.out.put(_END)
                continue
            try:
                self._jobs[self.stepper.submit(job.prompt_ids, job.params)] = job
            except Exception as e:          # refused at submit (vocabulary, capacity, ...)
                job.out.put(e)

    def _work(self) -> None:
        while not self._closed.is_set():
            self._admit(block=not self.stepper.has_work())
            if not self.stepper.has_work():
                continue
            try:
                events = self.stepper.step()
            except Exception as e:          # the step's requests fail (the engine finished them); the rest go on
                failed = [rid for rid in self._jobs if self.stepper.is_finished(rid)] or list(self._jobs)
                for rid in failed:
                    self.stepper.release(rid)
                    self._jobs.pop(rid).out.put(e)
                continue
            for rid, tok, ts in events:
                job = self._jobs.get(rid)
                if job is not None:
                    job.out.put(tok if isinstance(tok, BaseException) else (tok, ts))
            for rid, job in list(self._jobs.items()):
                if self.stepper.is_finished(rid) or job.cancel.is_set():
                    self.stepper.release(rid)       # a cancelled one stops here
                    job.out.put(_END)
                    del self._jobs[rid]
        err = RuntimeError("the engine was closed before this request finished")
        for job in self._jobs.values():
            job.out.put(err)
        while True:
            try:
                self._inbox.get_nowait().out.put(err)
            except queue.Empty:
                return

    def prepare(self, rows: int, first_position: int, last_position: int) -> None:
        """Build ahead what the stepping engine would build lazily for decode steps of up to `rows`
        requests feeding positions in [first_position, last_position] (the GPU engine's decode CUDA
        graphs). Called between phases, while the worker is idle; the engine's own lock keeps it
        apart from a step."""
        prepare = getattr(self.stepper, "prepare", None)
        if prepare is not None:
            prepare(rows, first_position, last_position)

    def close(self, timeout_s: float = 30.0) -> None:
        """Stop the worker (after its current step) and drop the engine, so its memory (the GPU
        engine's pools) can be freed before another engine is built. Closed while Ctrl-C or
        SIGTERM unwinds, it does not wait: no engine comes next, and a long prefill step would hold
        the exit back."""
        self._closed.set()
        unwinding = sys.exc_info()[0]
        if unwinding is not None and issubclass(unwinding, KeyboardInterrupt):
            timeout_s = 0.0
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout_s)
        if not self._thread.is_alive():
            self.stepper = None

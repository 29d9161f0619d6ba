"""Continuous-batching scheduler (host logic only, no tensors): admission by memory and by
--max-running-requests, chunked prefill under a token budget, decode set, stop conditions.

Memory is reserved at admission for the request's whole life (prompt + max_new_tokens pages and
one GLA state slot), so a running request can never run out of cache and nothing is preempted.
A request that could never fit is refused at submit with CapacityError."""

from __future__ import annotations

import math
import time
from collections import deque
from dataclasses import dataclass, field

from salactl.errors import CapacityError, UsageError
from salactl.runtime.gpu.pools import IdAllocator
from salactl.runtime.sampling import SamplingParams


@dataclass(eq=False)                    # identity: `in` / `remove` on the queues
class Request:
    rid: int
    prompt: list[int]
    params: SamplingParams
    stops: frozenset[int]
    arrival: float = field(default_factory=time.perf_counter)
    slot: int = -1
    pages: list[int] = field(default_factory=list)
    prefilled: int = 0
    output: list[int] = field(default_factory=list)
    token_times: list[float] = field(default_factory=list)   # perf_counter when each output token was sampled
    finish_reason: str | None = None
    first_token_time: float | None = None
    finish_time: float | None = None
    generator: object = None
    processors: object = None                   # its sampling.LogitsProcessors; None when none is on
    error: BaseException | None = None          # what failed the step that finished it ("error")

    prefill_calls: int = 0
    evented: int = 0                            # output tokens GPUEngine.events() has yielded
    error_evented: bool = False                 # whether events() has taken its error for raising

    @property
    def tokens_needed(self) -> int:
        """Cache positions the request writes: the last sampled token is never fed back."""
        return len(self.prompt) + max(self.params.max_new_tokens - 1, 0)

    @property
    def next_position(self) -> int:
        """Position of output[-1] when it is fed back (decode)."""
        return len(self.prompt) + len(self.output) - 1

    def accept(self, token: int, at: float | None = None) -> bool:
        """Record a token sampled at perf_counter time `at` (None: now); returns True when the
        request is finished."""
        self.output.append(token)
        self.token_times.append(time.perf_counter() if at is None else at)
        if token in self.stops:
            self.finish_reason = "stop"
        elif len(self.output) >= self.params.max_new_tokens:
            self.finish_reason = "length"
        return self.finish_reason is not None


class Scheduler:
    def __init__(self, pages: IdAllocator, slots: IdAllocator, block_size: int, max_running: int,
                 chunk_tokens: int, max_context: int):
        if chunk_tokens <= 0:
            raise UsageError(f"chunk_size (--chunk-size) must be positive, got {chunk_tokens}")
        self.pages, self.slots, self.block = pages, slots, block_size
        self.max_running, self.chunk_tokens, self.max_context = max_running, chunk_tokens, max_context
        self.waiting: deque[Request] = deque()
        self.prefilling: list[Request] = []
        self.decoding: list[Request] = []

    def pages_for(self, req: Request) -> int:
        return math.ceil(req.tokens_needed / self.block)

    def add(self, req: Request) -> None:
        need = req.tokens_needed
        if need > self.max_context or self.pages_for(req) > self.pages.total:
            cap = min(self.max_context, self.pages.total * self.block)
            raise CapacityError(
                f"request {req.rid} needs {need} tokens of cache (prompt {len(req.prompt)} + "
                f"max_new_tokens {req.params.max_new_tokens} - 1) but the GPU cache holds at most {cap}; "
                "shorten it, or build the GPUEngine with more cache (mem_fraction, max_context or kv_tokens)")
        self.waiting.append(req)

    @property
    def running(self) -> int:
        return len(self.prefilling) + len(self.decoding)

    def has_work(self) -> bool:
        return bool(self.waiting or self.prefilling or self.decoding)

    def admit(self) -> list[Request]:
        """Move waiting requests in (FIFO) while a slot, the page reservation and the running
        limit allow; returns the newly admitted ones (their slot/pages are set)."""
        admitted = []
        while self.waiting and self.running < self.max_running and self.slots.free:
            req = self.waiting[0]
            if self.pages.free < self.pages_for(req):
                break
            self.waiting.popleft()
            req.slot = self.slots.alloc(1)[0]
            req.pages = self.pages.alloc(self.pages_for(req))
            self.prefilling.append(req)
            admitted.append(req)
        return admitted

    def prefill_plan(self) -> list[tuple[Request, int, int]]:
        """(request, first prompt index, count) chunks filling at most chunk_tokens tokens."""
        plan, budget = [], self.chunk_tokens
        for req in self.prefilling:
            if budget <= 0:
                break
            n = min(len(req.prompt) - req.prefilled, budget)
            plan.append((req, req.prefilled, n))
            budget -= n
        return plan

    def prefill_done(self, req: Request, n: int) -> bool:
        """Account n prefilled tokens; True when the prompt is complete."""
        req.prefilled += n
        if req.prefilled < len(req.prompt):
            return False
        self.prefilling.remove(req)
        return True

    def cancel(self, req: Request) -> None:
        """Drop a request wherever it is (waiting, prefilling, decoding) and free what it holds."""
        if req in self.waiting:
            self.waiting.remove(req)
        self.finish(req)

    def start_decoding(self, req: Request) -> None:
        self.decoding.append(req)

    def finish(self, req: Request) -> None:
        if req in self.decoding:
            self.decoding.remove(req)
        if req in self.prefilling:
            self.prefilling.remove(req)
        if req.slot >= 0:
            self.slots.release([req.slot])
            self.pages.release(req.pages)
        req.slot, req.pages = -1, []
        req.finish_time = time.perf_counter()

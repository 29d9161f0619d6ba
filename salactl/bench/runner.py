"""Run one timed phase against a target, the way SGLang's bench_serving does it.

Load: requests leave at their arrival times — all at t=0 (rate inf) or with gamma inter-arrival
gaps of mean 1/rate (shape = burstiness; 1 = Poisson), seeded — and a pool of `max_concurrency`
client threads sends them in order, so a limit makes a closed loop holding N requests in flight
(SOAR S1/S8). Unlimited, there is a client thread per request in flight: all started before the
clock at rate inf, else started as the requests in flight grow, a few idle ones kept ahead of the
arrivals (ClientPool). The send time is taken when a client thread picks the request up, so TTFT
excludes client-side waiting, as behind SGLang's semaphore.

Before the clock: one warmup request (the phase's first request, output capped at 32 tokens),
the target's preparation for the phase's concurrency (the embedded GPU engine captures the decode
CUDA graphs of every batch size it can reach), then a cache flush. Duration = first dispatch → last request returned.
Ctrl-C cancels the phase: in-flight streams are unblocked, client threads take no further request
(the cut ones count neither as done nor as failed) and KeyboardInterrupt propagates; the caller
keeps the records of phases that finished.
"""

from __future__ import annotations

import math
import threading
import time
from dataclasses import dataclass

import numpy as np

from salactl.bench.phase_checks import first_line
from salactl.bench.profiles import Phase
from salactl.bench.requests import BenchRequest, RequestResult
from salactl.bench.targets.base import RequestFailed, Target
from salactl.bench.threads import ClientPool
from salactl.errors import EndpointError, SalactlError

WARMUP_MAX_TOKENS = 32


@dataclass
class PhaseOutcome:
    phase: Phase
    results: list[RequestResult]
    duration: float
    device: dict
    started_at: float           # wall clock (time.time()) when the timed part began
    cache_flushed: bool | None = None   # None: the phase asked for no flush


class NullProgress:
    def begin(self, name: str, total: int) -> None: ...
    def advance(self, result: RequestResult) -> None: ...
    def end(self) -> None: ...


def arrival_times(n: int, rate: float, burstiness: float, seed: int) -> list[float]:
    """Offsets (s) from the start; the first request leaves at 0 (SGLang/vLLM `get_request`)."""
    if math.isinf(rate):
        return [0.0] * n
    rng = np.random.default_rng(seed)
    gaps = rng.gamma(shape=burstiness, scale=1.0 / (rate * burstiness), size=max(n - 1, 0))
    return [0.0] + [float(x) for x in np.cumsum(gaps)]


def run_request(target: Target, req: BenchRequest, max_tokens: int, phase: str,
                cancel: threading.Event) -> RequestResult:
    res = RequestResult(req.request_id, phase, req.input_len, max_tokens)
    st = time.perf_counter()
    res.start_time = st
    res.output_len_source = target.count_source
    marks: list[tuple[float, int]] = []     # (arrival, tokens so far) of each chunk that brought tokens
    total = 0
    try:
        for ch in target.stream(req, max_tokens, cancel):
            if ch.counts_only:
                total = ch.completion_tokens if ch.counted_by else max(total, ch.completion_tokens)
                res.output_len_source = ch.counted_by or res.output_len_source
                res.output_len_over_max = ch.over_max
            elif ch.completion_tokens > total:
                total = ch.completion_tokens
                marks.append((ch.timestamp, total))
        res.latency = time.perf_counter() - st
        res.output_len = total
        res.success = bool(marks)
        marks = spread_count(marks, total)
        if not marks:
            res.error = "the stream ended without any token"
    except RequestFailed as e:
        res.latency = time.perf_counter() - st
        res.error, res.failure = str(e), e.__cause__
    except Exception as e:      # never let one request kill its client thread (the phase would hang)
        res.latency = time.perf_counter() - st
        res.error, res.failure = f"{type(e).__name__}: {e}", e
    if marks:
        res.ttft, res.itl = marks[0][0] - st, per_token_itl(marks)
    return res


def spread_count(marks: list[tuple[float, int]], total: int) -> list[tuple[float, int]]:
    """The timed chunks with their counts made to end at `total`, a count that came only at the end
    (usage in a last chunk, or the client's estimate: the chunks were timed as one token each). The
    difference is spread evenly over the chunks after the first, which is the prefill's one token
    on vLLM and SGLang (several per later chunk under stream intervals or speculative decoding); a
    lone chunk takes it all."""
    if not marks or marks[-1][1] == total:
        return marks
    if len(marks) == 1:
        return [(marks[0][0], total)]
    diff, n = total - marks[-1][1], len(marks) - 1
    return [marks[0]] + [(ts, count + diff * j // n) for j, (ts, count) in enumerate(marks[1:], 1)]


def per_token_itl(marks: list[tuple[float, int]]) -> list[float]:
    """One entry per token after the first chunk, each chunk's gap spread evenly over the tokens it
    brought; a chunk that brought none (an estimate below the chunk count) joins the next one's gap."""
    itl = []
    last_t, last_n = marks[0]
    for ts, n in marks[1:]:
        if n > last_n:
            itl.extend([(ts - last_t) / (n - last_n)] * (n - last_n))
            last_t, last_n = ts, n
    return itl


def warmup(target: Target, req: BenchRequest, phase: str, cancel: threading.Event) -> None:
    """One untimed request; a failure stops the bench: the embedded runtime's own error (NaN logits,
    capacity, device) with its exit code, anything else as the endpoint's."""
    res = run_request(target, req, min(req.output_len, WARMUP_MAX_TOKENS), phase, cancel)
    if isinstance(res.failure, SalactlError) and not isinstance(res.failure, EndpointError):
        raise type(res.failure)(f"the warmup request of phase {phase} failed: {res.failure}") from res.failure
    if not res.success:
        raise EndpointError(f"the warmup request of phase {phase} failed ({first_line(res.error)}); "
                            "the target cannot serve this workload")


def _prepare(target: Target, phase: Phase, requests: list[BenchRequest]) -> None:
    """Let the target build, before the clock, what the phase's decode steps would build lazily; a
    phase whose requests all stop after their first token (prefill) decodes nothing."""
    decoding = [r for r in requests if r.output_len >= 2]
    if decoding:
        target.prepare(min(phase.max_concurrency or len(requests), len(requests)),
                       min(r.input_len for r in decoding), max(r.input_len + r.output_len - 2 for r in decoding))


def run_phase(target: Target, phase: Phase, requests: list[BenchRequest], seed: int = 1,
              progress=None) -> PhaseOutcome:
    progress = progress or NullProgress()
    cancel = threading.Event()          # set only here, on the way out of an interrupted phase
    try:
        for _ in range(phase.warmup_requests):
            warmup(target, requests[0], phase.name, cancel)
        _prepare(target, phase, requests)
        flushed = target.flush_cache() if phase.flush_cache else None
        outcome = _timed(target, phase, requests, seed, progress, cancel)
        outcome.cache_flushed = flushed
        return outcome
    except BaseException:
        cancel.set()
        target.cancel_all()
        raise


def _timed(target, phase, requests, seed, progress, cancel) -> PhaseOutcome:
    n = len(requests)
    arrivals = arrival_times(n, phase.request_rate, phase.burstiness, seed)
    results: list[RequestResult | None] = [None] * n
    done = threading.Event()
    lock = threading.Lock()
    remaining = [n]

    def serve(item) -> bool:
        if cancel.is_set():
            return False
        i, req = item
        res = run_request(target, req, req.output_len, phase.name, cancel)
        if cancel.is_set():             # the phase is abandoned: a cut request is no failure of the target
            return False
        results[i] = res
        progress.advance(res)
        with lock:
            remaining[0] -= 1
            if remaining[0] == 0:
                done.set()
        return True

    open_loop = phase.max_concurrency is None and not math.isinf(phase.request_rate)
    fix = f"give phase {phase.name} a max_concurrency" if open_loop else f"lower phase {phase.name}'s max_concurrency"
    clients = ClientPool(serve, min(phase.max_concurrency or n, n), open_loop, phase.name, fix)
    clients.start()                     # the first client threads run before the clock starts
    try:
        progress.begin(phase.name, n)
        target.phase_begin()
        wall0 = time.time()
        t0 = time.perf_counter()
        for i, (req, at) in enumerate(zip(requests, arrivals)):
            while (wait := t0 + at - time.perf_counter()) > 0:
                time.sleep(min(wait, 0.05))
            clients.dispatch((i, req))
        clients.close()
        while not done.wait(0.05):
            pass
    except BaseException:
        cancel.set()                    # before the client threads take another request
        clients.close()                 # wakes the idle ones, so that they end
        raise
    duration = time.perf_counter() - t0
    progress.end()
    finished = [r for r in results if r is not None]
    device = target.phase_end(sum(r.output_len for r in finished if r.success))
    return PhaseOutcome(phase, finished, duration, device, wall0)

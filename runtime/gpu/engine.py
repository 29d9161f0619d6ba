"""GPU engine: continuous batching over paged caches with CUDA-graph decode.

One request takes Engine's calls; whatever runs at the same time is batched:
    engine = GPUEngine(model, "cuda", max_running_requests=64)
    res = engine.generate(prompt_ids, SamplingParams(...), eos_ids=eos)   # a GenerationResult
    for token in engine.stream(prompt_ids, params): ...                  # its token ids
Many requests:
    results = engine.generate_batch([(prompt_ids, SamplingParams(...)), ...])
    rid = engine.submit(prompt_ids, params); for rid, token, t in engine.events(): ...
    res = engine.result(rid)

Each step admits waiting requests (slot + page reservation), runs one prefill chunk (up to
chunk_size tokens, possibly from several requests) and then one decode step over every request
that has a token to feed, so prefill is interleaved with decode. profile_ops=True runs eagerly
with CUDA-event timing per op class (for the roofline) instead of graph replay.
"""

from __future__ import annotations

import functools
import os
import threading
import time
from contextlib import contextmanager
from typing import Callable, Iterable, Iterator

import torch

from salactl.errors import AllTokensBannedError, DeviceError, NumericsError, UsageError
from salactl.runtime.engine import (GenerationResult, PhaseStats, check_callback, check_ending_ids, check_prompt,
                                    current_cuda_device, model_and_device, warn_model_limits)
from salactl.runtime.gpu.backend import GPUBackend
from salactl.runtime.gpu.fast_model import fuse_model
from salactl.runtime.gpu.mem_fraction import DEFAULT_MEM_FRACTION, check_mem_fraction
from salactl.runtime.gpu.pools import CachePools, IdAllocator, plan_pools
from salactl.runtime.gpu.runner import ModelRunner
from salactl.runtime.gpu.scheduler import Request, Scheduler
from salactl.runtime.kv_fp8 import fp8_dtype, kv_item_bytes, model_kv_scales, resolve_kv_scales
from salactl.runtime.ops.device_props import sm_count
from salactl.runtime.ops.gla.triton import FLA, prefill_impl
from salactl.runtime.ops.selection.gpu import check_shapes
from salactl.runtime.op_timer import NULL_TIMER, OpTimer
from salactl.runtime.sampling import (SamplingParams, as_float, as_token_ids, greedy, is_int,
                                      logits_processors, resolve_params, sample)

ROW_FAILURES = (NumericsError, AllTokensBannedError)    # what fails one request of a step, not the step


def fallback_notes(device: torch.device) -> list[str]:
    """Slow paths the engine takes on `device` for want of an optional package (for a warning)."""
    if device.type == "cuda" and prefill_impl(device) != FLA:
        return ["fla-core is not installed, so lightning-layer prefill runs the PyTorch reference "
                "(exact but slow); install it with: pip install 'salactl[gpu]'"]
    return []


def _serialised(method):
    """Run `method` holding the engine's lock (one thread at a time changes or steps it), on the
    engine's GPU whichever thread calls (current_cuda_device)."""
    @functools.wraps(method)
    def locked(self, *args, **kwargs):
        with self._lock, current_cuda_device(self.device):
            return method(self, *args, **kwargs)
    return locked


class GPUEngine:
    """Continuous-batching engine for many concurrent requests on one CUDA GPU (Triton kernels).

    generate() and stream() take Engine's arguments for one request; the requests that run at
    the same time (interleaved stream()s, submit()ted ones) advance together in each step.
    generate_batch() runs a list of requests together; submit() / events() / result() drive
    the engine request by request.

    model: a SalaForCausalLM or LoadedModel on a CUDA device; device: None = the model's (a CPU
    device is refused unless TRITON_INTERPRET=1, the kernel tests' interpreter). The cache pools
    take mem_fraction of the free GPU memory, sized for max_context tokens per request, or
    exactly kv_tokens tokens in all. kv_cache_dtype: "bf16" (the activation dtype), "fp8_e4m3"
    or "fp8_e5m2", as Engine takes it. chunk_size: prompt tokens per prefill step. eos_ids: stop
    ids added to every request's.

    Each submitted request is kept until result(rid) takes it: call result() for every rid you
    submit() (generate(), generate_batch() and stream() do). A caller who stops reading events()
    before its requests finish must abort(rid) them (otherwise they keep running in later steps)
    and then take result(rid).

    Several threads may share one engine: each call is serialised (each step runs for one
    caller at a time), and each thread's generate() / stream() steps the shared batch until its
    own request finishes, so concurrent requests are batched together.

    The engine fuses `model` in place (fuse=True): its modules are re-classed to the fused ones
    and its projection weights become views into concatenated ones (no second copy of the
    weights). Build the model anew (or before building a GPUEngine on it) for an unfused
    reference."""

    def __init__(self, model, device=None, *, mem_fraction: float = DEFAULT_MEM_FRACTION, max_running_requests: int = 64,
                 chunk_size: int = 8192, cuda_graph: bool = True, max_context: int | None = None,
                 kv_tokens: int | None = None, kv_cache_dtype: str = "bf16",
                 profile_ops: bool = False, fuse: bool = True, free_bytes: int | None = None,
                 eos_ids: Iterable[int] = ()):
        mem_fraction = _check_sizes(mem_fraction, max_running_requests, chunk_size, max_context, kv_tokens,
                                    free_bytes)
        kv_dtype = fp8_dtype(kv_cache_dtype)           # an unknown name fails before any work
        self.kv_cache_dtype = kv_cache_dtype
        model, self.device = model_and_device(model, device)
        if self.device.type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
            raise DeviceError(f"GPUEngine needs a CUDA device, got {str(self.device)!r}; use Engine on the "
                              "CPU (TRITON_INTERPRET=1 runs the kernels in Triton's interpreter, for tests)")
        self.config = model.config
        check_shapes(self.config)                      # before fuse_model changes the caller's model
        # FP8 KV policy (runtime/kv_fp8.py: e5m2 defaults to 1.0, e4m3 without calibration is
        # refused), before the pools take the GPU's memory
        self.kv_scales = resolve_kv_scales(self.config, kv_cache_dtype, model_kv_scales(model), self.device)
        self.dtype = model.model.embed_tokens.weight.dtype
        # measured before fuse_model, whose concatenated weights replace the originals (these go to
        # torch's allocator cache, which mem_get_info would count as used)
        if free_bytes is None:
            free_bytes = (torch.cuda.mem_get_info(self.device)[0] if self.device.type == "cuda" else 2 << 30)
        act_itemsize = torch.empty(0, dtype=self.dtype).element_size()
        kv_dtype = kv_dtype or self.dtype
        if max_context is None and kv_tokens is None:
            max_context = 1 << 20 | 1 << 14
        # a cache that cannot fit is refused before fuse_model changes the caller's model
        plan = plan_pools(self.config, free_bytes, mem_fraction, max_running_requests, chunk_size,
                          kv_itemsize=kv_item_bytes(kv_cache_dtype, act_itemsize), act_itemsize=act_itemsize,
                          max_context=max_context if max_context is not None else kv_tokens,
                          kv_tokens=kv_tokens)
        self.plan = plan
        self.model = fuse_model(model) if fuse else model
        self.pools = CachePools(self.config, plan, self.device, self.dtype, kv_dtype)
        for li, layer in enumerate(self.config.sparse_layers if self.kv_scales else ()):
            self.pools.k_scale[li], self.pools.v_scale[li] = self.kv_scales[layer]
        sms = sm_count(self.device) if self.device.type == "cuda" else 4
        self.backend = GPUBackend(self.config, self.pools, num_sms=sms)
        self.profile_ops = profile_ops
        self.runner = ModelRunner(self.model, self.pools, self.backend, self.device, max_running_requests,
                                  cuda_graph=cuda_graph and not profile_ops)
        B = self.config.sparse_config.block_size
        self.max_context = plan.max_pages_per_seq * B
        self.scheduler = Scheduler(IdAllocator(plan.pages, "KV cache pages"),
                                   IdAllocator(plan.slots, "request slots"), B, max_running_requests,
                                   chunk_size, self.max_context)
        eos_ids = as_token_ids(eos_ids, "eos_ids")
        check_ending_ids(eos_ids, self.config.vocab_size)
        self.eos_ids = frozenset(eos_ids) | frozenset(self.config.eos_token_id)
        self.requests: dict[int, Request] = {}
        self._next_id = 0
        self.timers = {"prefill": OpTimer(self.device), "decode": OpTimer(self.device)}
        self.gla_prefill = prefill_impl(self.device)
        # re-entrant: locked methods call each other, and a stream collected by a GC pass mid-step
        # drops its request in the stepping thread (deferred to the step's end: _deferring)
        self._lock = threading.RLock()
        self._stepping = 0
        self._deferred: list[tuple[int, str, bool]] = []     # (rid, finish reason, forget it)

    def fallback_notes(self) -> list[str]:
        return fallback_notes(self.device)

    @_serialised
    def capture_decode_graphs(self, rows: int, first_position: int, last_position: int) -> int:
        """Capture ahead of time the decode CUDA graphs that steps of up to `rows` requests can
        replay when the positions they feed span [first_position, last_position] (a request's first
        decode step feeds its prompt length, its last prompt + output - 2), so the first step at each
        batch size pays for no kernel compilation or capture (a bench phase calls this before its
        clock). A step is sparse iff some row's p + 1 >= dense_len (ModelRunner.decode). Returns how
        many graphs were captured."""
        dense_len = self.config.sparse_config.dense_len
        return self.runner.capture_graphs(rows, dense=first_position + 1 < dense_len,
                                          sparse=last_position + 1 >= dense_len)

    # ---- API --------------------------------------------------------------------------------
    def submit(self, prompt_ids, params: SamplingParams | None = None,
               eos_ids: Iterable[int] | int | None = None) -> int:
        """Queue one request; returns its request id. It runs in later step()s / events().

        prompt_ids: token ids (a list of ints or a 1-D integer tensor/array). params: SamplingParams
        (None = the defaults). eos_ids: stop ids for this request on top of the engine's (ignored
        with params.ignore_eos). A request that could never fit the cache is a CapacityError."""
        return self._submit(prompt_ids, params, eos_ids).rid

    @_serialised
    def _submit(self, prompt_ids, params, eos_ids) -> Request:
        params = resolve_params(params)
        prompt = check_prompt(prompt_ids, self.config.vocab_size)
        eos_ids = as_token_ids(eos_ids, "eos_ids")
        check_ending_ids(params.stop_token_ids + eos_ids, self.config.vocab_size)
        eos = self.eos_ids | frozenset(eos_ids)
        warn_model_limits(self.config, len(prompt), params.max_new_tokens)
        stops = frozenset(params.stop_token_ids) | (frozenset() if params.ignore_eos else eos)
        req = Request(self._next_id, prompt, params, stops)
        req.processors = logits_processors(params, prompt, stops, self.config.vocab_size, self.device)
        if params.temperature > 0:
            seed = params.seed if params.seed is not None else 0
            req.generator = torch.Generator(device=self.device).manual_seed(seed)
        self.scheduler.add(req)
        self.requests[req.rid] = req
        self._next_id += 1
        return req

    def generate(self, prompt, params: SamplingParams | None = None, eos_ids=(),
                 on_token: Callable[[int], bool | None] | None = None,
                 prefill_progress: Callable[[int, int], None] | None = None) -> GenerationResult:
        """Engine.generate's contract for one request: generate until it finishes and return its
        GenerationResult; on_token(id) is called with each of its tokens as it is sampled
        (returning True ends the request after that token, finish_reason "stop") and
        prefill_progress(done, total) after each step that prefilled part of its prompt. Other
        requests submitted to the engine advance in the same steps (and may still be running)."""
        check_callback(on_token, "on_token")
        check_callback(prefill_progress, "prefill_progress")
        req = self._submit(prompt, params, eos_ids)
        try:
            for kept, tok in enumerate(self._tokens(req, prefill_progress), 1):
                if on_token and on_token(tok) is True:
                    self._stop_after(req, kept)
                    break
        except BaseException:            # an error, or Ctrl-C: stop the request, keep nothing
            self._drop([req.rid])
            raise
        return self.result(req.rid)

    @_serialised
    def _stop_after(self, req: Request, kept: int) -> None:
        """Finish the request as "stop" after its first `kept` tokens (its on_token asked to), dropping
        any sampled since: one step may sample two, or another caller's step may have run it on. The
        caller's stop wins, as in Engine, over "length" and over an "error" of a later token."""
        if req.finish_reason is None:
            self.abort(req.rid, "stop")
        elif req.finish_reason in ("length", "error"):
            req.finish_reason, req.error = "stop", None
        del req.output[kept:], req.token_times[kept:]

    def stream(self, prompt, params: SamplingParams | None = None, eos_ids=()) -> Iterator[int]:
        """Engine.stream's contract for one request: its token ids, each as soon as it is sampled.
        Bad arguments raise here, not at the first next(). Each next() steps the engine as needed,
        advancing every running request, so several stream()s can be read in turn. The request is
        released when it finishes, and aborted and released when the generator is closed (or
        collected) before that; an error in a step propagates."""
        tokens = self._stream(self._submit(prompt, params, eos_ids))
        next(tokens)
        return tokens

    def _stream(self, req: Request) -> Iterator[int]:
        try:
            yield            # stream() runs to here: closing a stream never read still releases it
            yield from self._tokens(req)
        finally:
            self._drop([req.rid])

    def _tokens(self, req: Request, prefill_progress: Callable[[int, int], None] | None = None) -> Iterator[int]:
        """The request's tokens as they are produced, stepping the engine until it finishes. Read
        from its output list, not step()'s events: another caller's step (in this thread or
        another) may have produced them (and may even have taken its result). The lock is held
        for a snapshot or a step, never across a yield or a callback: an abandoned stream blocks
        no other thread."""
        sent, reported = 0, 0
        while True:
            with self._lock:
                new, prefilled = req.output[sent:], req.prefilled
                error, finished = req.error, req.finish_reason is not None
            if prefill_progress and prefilled != reported:     # as Engine: after each chunk
                reported = prefilled
                prefill_progress(reported, len(req.prompt))
            for tok in new:                              # one step may sample two (prefill + decode)
                yield tok
                sent += 1
            if error is not None:                        # another caller's step failed with it
                raise error
            if finished:
                return
            with self._lock:
                if len(req.output) == sent and req.finish_reason is None:   # not advanced meanwhile
                    self.step()

    def generate_batch(self, requests: list[tuple[list[int], SamplingParams | None]]) -> list[GenerationResult]:
        """Run [(prompt_ids, params), ...] batched together (with anything submitted before) to
        completion; returns their GenerationResults in order. A request that fails alone (NaN/Inf
        logits, or logits processors that ban every token) finishes with reason "error" and its
        tokens so far while the others run on; only when every request failed so is the first one's
        error raised (as generate() raises it). Any other error drops the batch's requests and
        propagates."""
        rids = []
        try:
            for i, item in enumerate(requests):
                if not isinstance(item, (tuple, list)) or len(item) != 2:
                    size = f" of length {len(item)}" if isinstance(item, (tuple, list)) else ""
                    raise UsageError(f"generate_batch takes a list of (prompt_ids, params) pairs; item {i} is "
                                     f"{type(item).__name__}{size}: pass [(ids, SamplingParams(...) or None), ...]")
                rids.append(self.submit(*item))
            while self.scheduler.has_work():        # events() without its raise: the requests keep their errors
                self.step()
        except BaseException:
            self._drop(rids)
            raise
        errors = [self.requests[r].error for r in rids]
        results = [self.result(r) for r in rids]
        if errors and all(errors):
            raise errors[0]
        return results

    def events(self) -> Iterator[tuple[int, int, float]]:
        """(request_id, token_id, perf_counter timestamp) for every token the engine's requests
        produce, in the order they were sampled, stepping the engine until every submitted request
        has finished. submit() may be called between items; result(rid) gives each request's
        GenerationResult once it has finished. Tokens sampled by any caller's step (a stream() or
        generate() in this thread or another) are yielded too, each once: two events() readers
        share them, and a request whose result() was taken before its tokens were read is skipped.
        A request that fails alone (NaN/Inf logits, every token banned) finishes with reason
        "error" while the others run on; once all have finished, events() raises the first such
        error (every result(rid), the others' included, stays available). The lock is held for a
        snapshot or a step, never across a yield: an abandoned events() blocks no other thread."""
        failed = None
        while True:
            with self._lock:
                new, error = self._unread_events()
                if not new and error is None:
                    if not self.scheduler.has_work():
                        break
                    self.step()
                    continue
            failed = failed or error
            yield from new
        if failed is not None:
            raise failed

    def _unread_events(self) -> tuple[list[tuple[int, int, float]], BaseException | None]:
        """The tokens no events() reader has yielded yet (marked as yielded), oldest first, and
        the first error not yet taken for raising. Call with the lock held."""
        new, error = [], None
        for req in list(self.requests.values()):     # a stream collected meanwhile may drop its request
            times = req.token_times
            new += [(req.rid, req.output[i], times[i]) for i in range(req.evented, len(req.output))]
            req.evented = len(req.output)
            if req.error is not None and not req.error_evented:
                req.error_evented = True
                error = error or req.error
        new.sort(key=lambda event: event[2])          # stable: one step's tokens stay in request order
        return new, error

    @_serialised
    def _drop(self, rids: list[int]) -> None:
        """Abort (if still running) and forget these requests (skipping any whose result was
        taken already, e.g. by a caller reading events()); at the end of a step running now."""
        for rid in rids:
            if rid not in self.requests:
                continue
            if self._stepping:
                self._deferred.append((rid, "abort", True))
            else:
                self._end(self.requests.pop(rid), "abort")

    @_serialised
    def result(self, rid: int) -> GenerationResult:
        """A finished request's GenerationResult, handed over once: the engine forgets the request."""
        req = self.requests.get(rid)
        if req is None:
            raise UsageError(f"request {rid} is unknown: never submitted, or its result was taken already")
        if req.finish_reason is None:
            raise UsageError(f"request {rid} has not finished")
        del self.requests[rid]
        first = req.first_token_time or req.finish_time
        pre = PhaseStats(len(req.prompt), req.prefill_calls, first - req.arrival)
        ttft = pre.seconds if req.first_token_time else None
        n_dec = max(len(req.output) - 1, 0)
        dec = PhaseStats(n_dec, n_dec, (req.finish_time - first) if n_dec else 0.0)
        if self.profile_ops:
            pre.op_seconds = self.timers["prefill"].totals()
            dec.op_seconds = self.timers["decode"].totals()
        return GenerationResult(list(req.prompt), list(req.output), req.finish_reason, ttft, pre, dec)

    @_serialised
    def abort(self, rid: int, reason: str = "abort") -> None:
        """Finish a request now (finish_reason `reason` unless it already finished), freeing its
        slot and pages; later steps carry on with the other requests. Its output so far stays
        available to result(rid). Called during a step (from a finalizer), it ends the request
        when that step ends."""
        req = self.requests.get(rid)
        if req is None:
            raise UsageError(f"request {rid} is unknown: never submitted, or its result was taken already")
        if self._stepping:
            self._deferred.append((rid, reason, False))
        else:
            self._end(req, reason)

    def _end(self, req: Request, reason: str) -> None:
        if req.finish_reason is None:
            req.finish_reason = reason
            if req.slot >= 0:
                self.backend.release_slot(req.slot)
            self.scheduler.cancel(req)

    @contextmanager
    def _deferring(self):
        """Hold back the abort() / _drop() calls that arrive during a step until it ends. They come
        from finalizers (a stream collected by a GC pass inside the step's forward, in this thread
        under the re-entrant lock); run at once, they would pull requests out of the scheduler's
        lists while the step works on them."""
        self._stepping += 1
        try:
            yield
        finally:
            try:
                while self._stepping == 1 and self._deferred:     # any arriving meanwhile join the queue
                    rid, reason, forget = self._deferred.pop(0)
                    req = self.requests.pop(rid, None) if forget else self.requests.get(rid)
                    if req is not None:
                        self._end(req, reason)
            finally:
                self._stepping -= 1

    # ---- one scheduler step -----------------------------------------------------------------
    @_serialised
    def step(self) -> list[tuple[int, int | BaseException, float]]:
        """One admission + prefill chunk + decode step; returns (request id, token id, timestamp)
        events. A request whose logits are NaN/Inf, or whose logits processors ban every token, fails
        alone: it is finished with reason "error" and its event carries the NumericsError or
        AllTokensBannedError instead of a token id. If a phase raises, the requests it ran are
        finished with reason "error" (their memory freed) before the error propagates."""
        with self._deferring():
            return self._step()

    def _step(self) -> list[tuple[int, int | BaseException, float]]:
        sched, events = self.scheduler, []
        admitted = sched.admit()
        with self._abort_on_error(admitted):     # a slot is never left half reset
            for req in admitted:
                self.pools.assign_pages(req.slot, req.pages)
                self.pools.clear_pages(req.pages)         # whatever an earlier owner left (NaN K/V)
                self.pools.state[:, req.slot].zero_()
                self.backend.release_slot(req.slot)
        plan = sched.prefill_plan()
        if plan:
            with self._abort_on_error([r for r, _, _ in plan]):
                self._prefill_step(plan, events)
        if sched.decoding:
            reqs = list(sched.decoding)
            with self._abort_on_error(reqs):
                self._decode_step(reqs, events)
        return events

    @contextmanager
    def _abort_on_error(self, reqs: list[Request]):
        try:
            yield
        except BaseException as e:
            for r in reqs:
                if r.finish_reason is None:      # what its own stream() raises when read later
                    r.error = e if isinstance(e, Exception) else RuntimeError(
                        f"the step that ran this request was interrupted ({type(e).__name__})")
                self._end(r, "error")
            raise

    def _prefill_step(self, plan, events) -> None:
        sched = self.scheduler
        timer = self.timers["prefill"] if self.profile_ops else NULL_TIMER
        logits = self.runner.prefill([(r.slot, r.prompt[s:s + n], s) for r, s, n in plan], timer)
        for r, _, _ in plan:
            r.prefill_calls += 1
        done = [(i, r) for i, (r, s, n) in enumerate(plan) if sched.prefill_done(r, n)]
        live = [(i, r) for i, r in done if r.params.max_new_tokens > 0]
        for _, r in done:
            if r.params.max_new_tokens == 0:
                r.finish_reason = "length"
                self._finish(r)
        if live:
            toks = self._sample(logits[[i for i, _ in live]], [r for _, r in live])
            now = time.perf_counter()
            for (_, r), tok in zip(live, toks):
                if isinstance(tok, ROW_FAILURES):
                    self._fail(r, tok, now, events)
                    continue
                r.first_token_time = now
                events.append((r.rid, tok, now))
                if r.accept(tok, now):
                    self._finish(r)
                else:
                    sched.start_decoding(r)

    def _decode_step(self, reqs: list[Request], events) -> None:
        timer = self.timers["decode"] if self.profile_ops else NULL_TIMER
        logits = self.runner.decode([(r.slot, r.output[-1], r.next_position) for r in reqs], timer)
        toks = self._sample(logits, reqs)
        now = time.perf_counter()
        for r, tok in zip(reqs, toks):
            if isinstance(tok, ROW_FAILURES):
                self._fail(r, tok, now, events)
                continue
            events.append((r.rid, tok, now))
            if r.accept(tok, now):
                self._finish(r)

    def _finish(self, req: Request) -> None:
        if req.slot >= 0:
            self.backend.release_slot(req.slot)
        self.scheduler.finish(req)

    def _fail(self, req: Request, error: Exception, now: float, events) -> None:
        req.error = error
        self._end(req, "error")
        events.append((req.rid, error, now))

    @staticmethod
    def _sample(logits: torch.Tensor, reqs: list[Request]) -> list[int | NumericsError | AllTokensBannedError]:
        """Each request's next token, or the error of a row that has none (NaN/Inf logits, every
        token banned by its logits processors): that row fails only its own request. Greedy rows
        take the batched argmax, unless a logits processor of theirs is on: those, like sampled
        rows, go row by row."""
        try:
            top = greedy(logits)
        except NumericsError as e:      # which rows: rare, so a second pass here, not a sync every step
            finite = torch.isfinite(logits.max(dim=-1).values).tolist()
            top = [greedy(row[None])[0] if ok else e for row, ok in zip(logits, finite)]
        return [g if isinstance(g, NumericsError) or (r.params.temperature == 0 and r.processors is None)
                else _sample_row(logits[i], r) for i, (g, r) in enumerate(zip(top, reqs))]


def _sample_row(logits: torch.Tensor, req: Request) -> int | NumericsError | AllTokensBannedError:
    try:
        return sample(logits, req.params, req.generator, req.processors)
    except ROW_FAILURES as e:
        return e


def _check_sizes(mem_fraction, max_running_requests, chunk_size, max_context, kv_tokens, free_bytes) -> float:
    """GPUEngine's sizing arguments checked before any work (UsageError naming the bad one); returns
    mem_fraction as a float."""
    for name, flag, value, optional in (
            ("max_running_requests", " (--max-running-requests)", max_running_requests, False),
            ("chunk_size", " (--chunk-size)", chunk_size, False), ("max_context", "", max_context, True),
            ("kv_tokens", "", kv_tokens, True), ("free_bytes", "", free_bytes, True)):
        if not (optional and value is None) and (not is_int(value) or value <= 0):
            none = " or None" if optional else ""
            raise UsageError(f"{name}{flag} must be a positive integer{none}, got {value!r}")
    mem_fraction = as_float("mem_fraction", mem_fraction)
    check_mem_fraction(mem_fraction)
    return mem_fraction

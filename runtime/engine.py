"""Single-process generation engine: chunked prefill, then decode, over any attention backend.
Used by `salactl run` / `eval` on CPU and as the correctness baseline for the GPU engine."""

from __future__ import annotations

import sys
import time
import warnings
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Callable, Iterator

import torch

from salactl.errors import DeviceError, ModelLimitWarning, UsageError
from salactl.runtime.backend_reference import ReferenceBackend
from salactl.runtime.batch import ForwardBatch
from salactl.runtime.cache import SequenceCache
from salactl.runtime.device_sync import synchronize
from salactl.runtime.kv_fp8 import model_kv_scales, resolve_kv_scales
from salactl.runtime.layers.model import SalaForCausalLM
from salactl.runtime.loader import LoadedModel, resolve_device
from salactl.runtime.op_timer import NULL_TIMER, OpTimer
from salactl.runtime.sampling import (SamplingParams, as_token_ids, is_int, logits_processors, resolve_params,
                                      sample)


@dataclass
class PhaseStats:
    """One phase (prefill or decode) of a generation.

    tokens: prompt tokens fed (prefill) or tokens fed back (decode: output length - 1, the last
    sampled token is never fed). forward_calls: model calls (prefill: chunks; decode: = tokens).
    seconds: wall seconds of the phase (prefill: until the first token is sampled, = ttft_s, or
    until the prompt's last forward call when none is;
    decode: from then to the last token, 0.0 with fewer than 2 output tokens). op_seconds:
    {op class: seconds}, empty (GPU engine: None) unless op timing was asked for
    (Engine(time_ops=True), GPUEngine(profile_ops=True))."""

    tokens: int = 0
    forward_calls: int = 0
    seconds: float = 0.0
    op_seconds: dict[str, float] = field(default_factory=dict)


@dataclass
class GenerationResult:
    """One finished generation.

    prompt_token_ids: the ids that ran (ints). output_token_ids: the sampled ids, including the
    stop/EOS token that ended generation, if one did (Tokenizer.decode drops special tokens).
    finish_reason: "length" (max_new_tokens reached), "stop" (a stop or EOS id was sampled, or
    on_token returned True, as for a stop string); the GPU engine adds "abort" (GPUEngine.abort)
    and "error" (its step raised, or its logits were NaN/Inf). ttft_s: wall seconds from the start
    of prefill to the first sampled token; None when no token was sampled (max_new_tokens=0, or aborted before one)."""

    prompt_token_ids: list[int]
    output_token_ids: list[int]
    finish_reason: str
    ttft_s: float | None
    prefill: PhaseStats
    decode: PhaseStats


def check_prompt(prompt, vocab_size: int) -> list[int]:
    """The prompt as a list of ints: a list/tuple of integer token ids or a 1-D integer tensor /
    array; text, floats, an empty prompt or ids outside [0, vocab_size) are a UsageError."""
    if isinstance(prompt, (str, bytes)):
        raise UsageError("the prompt is text; pass token ids (Tokenizer.encode(text) gives them)")
    if hasattr(prompt, "tolist") and hasattr(prompt, "ndim"):      # torch tensor, numpy array
        if prompt.ndim != 1:
            raise UsageError(f"a prompt tensor must be 1-D, got shape {tuple(prompt.shape)}")
        prompt = prompt.tolist()
    try:
        ids = list(prompt)
    except TypeError:
        raise UsageError(f"the prompt must be a list of token ids, got {type(prompt).__name__}") from None
    if not ids:
        raise UsageError("the prompt is empty; give at least one token")
    for t in ids:
        if not is_int(t):
            raise UsageError(f"prompt token ids must be integers, got {t!r}")
        if not 0 <= t < vocab_size:
            raise UsageError(f"prompt token id {t} is outside the vocabulary (size {vocab_size})")
    return [int(t) for t in ids]


def ending_token_ids(config, params: SamplingParams, eos_ids=()) -> frozenset[int]:
    """The ids that end a generation: params.stop_token_ids and, unless params.ignore_eos, the
    model's config.eos_token_id and `eos_ids`."""
    eos = frozenset() if params.ignore_eos else frozenset(eos_ids) | frozenset(config.eos_token_id)
    return frozenset(params.stop_token_ids) | eos


def warn_model_limits(config, prompt_tokens: int, max_new_tokens: int) -> None:
    """A ModelLimitWarning (Python's warnings; the CLI says the same with its flags) where the
    request runs past max_position_embeddings or reaches sparse attention with forced blocks
    filling the top-k. The texts name only the model's numbers, never the request's: Python
    remembers every distinct text it has shown from a line, so a per-request number would grow
    that registry by one entry per request length and repeat the warning for each."""
    total = prompt_tokens + max_new_tokens
    if total > config.max_position_embeddings:
        warnings.warn(f"the prompt plus max_new_tokens runs past the model's max_position_embeddings "
                      f"({config.max_position_embeddings:,} tokens); it runs, but quality beyond the "
                      "trained length is not guaranteed", ModelLimitWarning, stacklevel=_caller_stacklevel())
    note = config.sparse_config.forced_blocks_note
    if note and total >= config.sparse_config.dense_len:
        warnings.warn(note, ModelLimitWarning, stacklevel=_caller_stacklevel())


def _caller_stacklevel() -> int:
    """warnings.warn's stacklevel that names the first caller outside salactl (1 = the function
    that calls this one)."""
    level, frame = 1, sys._getframe(1)
    while frame is not None and frame.f_globals.get("__name__", "").startswith("salactl"):
        level, frame = level + 1, frame.f_back
    return level


def model_and_device(model, device) -> tuple[SalaForCausalLM, torch.device]:
    """The module to run (a LoadedModel gives its .model; anything else but a SalaForCausalLM is a
    UsageError) and its device. `device` None (or "auto") means the model's; any other must name the
    model's device (DeviceError otherwise)."""
    if isinstance(model, LoadedModel):
        model = model.model
    if not isinstance(model, SalaForCausalLM):
        hint = f"; for a preset or checkpoint pass load_model({model!r})" if isinstance(model, str) else ""
        raise UsageError("model must be the LoadedModel from load_model(...) or a SalaForCausalLM, "
                         f"got {type(model).__name__}{hint}")
    have = model.device
    if device is None or device == "auto":
        return model, have
    want = resolve_device(device)
    if want.type != have.type or (None not in (want.index, have.index) and want.index != have.index):
        raise DeviceError(f"device {str(want)!r} differs from the model's device {str(have)!r}; "
                          "pass device=None, or move the model (load_model(..., device=...))")
    return model, have


BACKENDS = {"reference": ReferenceBackend}


def attention_backend(backend, config):
    """`backend` as Engine runs it: None (the reference backend), a name in BACKENDS, or an object
    with the backend methods (softmax_attention, linear_attention), e.g. a ReferenceBackend."""
    if backend is None:
        backend = "reference"
    if isinstance(backend, str):
        if backend not in BACKENDS:
            raise UsageError(f"backend {backend!r} is unknown; valid: {', '.join(BACKENDS)}, or an attention "
                             "backend object such as ReferenceBackend (the Triton kernels run in GPUEngine)")
        return BACKENDS[backend](config)
    if not all(callable(getattr(backend, m, None)) for m in ("softmax_attention", "linear_attention")):
        raise UsageError(f"backend must be a name ({', '.join(BACKENDS)}) or an object with softmax_attention "
                         f"and linear_attention methods, got {type(backend).__name__}")
    return backend


def check_callback(fn, name: str) -> None:
    """A UsageError unless `fn` is None or callable (checked before any work runs)."""
    if fn is not None and not callable(fn):
        raise UsageError(f"{name} must be a function or None, got {fn!r}")


def check_ending_ids(ids, vocab_size: int) -> None:
    """A UsageError for a stop/EOS id the model can never sample (as_token_ids refused negatives)."""
    for t in ids:
        if t >= vocab_size:
            raise UsageError(f"stop token id {t} is outside the model's vocabulary (0..{vocab_size - 1})")


def current_cuda_device(device: torch.device):
    """A context making `device` the calling thread's current CUDA device (a no-op off CUDA). Triton
    launches on the current device's stream, and each thread's current device is cuda:0 unless set,
    so kernels for a model on cuda:1 would otherwise go to the wrong GPU."""
    return torch.cuda.device(device) if device.type == "cuda" else nullcontext()


class Engine:
    """Single-sequence generation engine: chunked prefill, then one token per decode step. Runs
    on CPU or CUDA; each generate()/stream() call owns its cache, so calls may interleave.

    model: a SalaForCausalLM or the LoadedModel from load_model. device: None = the model's.
    chunk_size: prompt tokens per prefill forward. backend: None or "reference" (plain-PyTorch
    attention), or an attention backend object. time_ops: fill PhaseStats.op_seconds (slower).
    kv_cache_dtype: "bf16" (the activation dtype), "fp8_e4m3" or "fp8_e5m2"."""

    def __init__(self, model, device=None, chunk_size: int = 512, backend=None, time_ops: bool = False,
                 kv_cache_dtype: str = "bf16"):
        if not is_int(chunk_size) or chunk_size <= 0:
            raise UsageError(f"chunk_size (--chunk-size) must be a positive integer, got {chunk_size!r}")
        self.model, self.device = model_and_device(model, device)
        self.config = self.model.config
        self.dtype = self.model.model.embed_tokens.weight.dtype    # never quantized, unlike lm_head
        self.chunk_size = chunk_size
        self.backend = attention_backend(backend, self.config)
        self.time_ops = time_ops
        # fp8 KV: calibrated scales from the checkpoint (runtime/kv_fp8.py says what happens without)
        self.kv_cache_dtype = kv_cache_dtype
        self.kv_scales = resolve_kv_scales(self.config, kv_cache_dtype, model_kv_scales(self.model),
                                           self.device)

    def new_sequence(self) -> SequenceCache:
        return SequenceCache(self.config, self.device, self.dtype, kv_cache_dtype=self.kv_cache_dtype,
                             kv_scales=self.kv_scales)

    @torch.inference_mode()
    def forward(self, seq: SequenceCache, token_ids: list[int], timer=NULL_TIMER, all_logits: bool = False):
        """Run n new tokens of one sequence through the model; returns fp32 logits [1, vocab]
        (the last row), or [n, vocab] with all_logits."""
        with current_cuda_device(self.device):
            ids = torch.tensor(token_ids, device=self.device, dtype=torch.long)
            batch = ForwardBatch.build(self.config, [seq], [len(token_ids)], self.backend, self.device, timer)
            rows = None if all_logits else batch.last_rows()
            logits = self.model(ids, batch, rows)
            batch.commit()
        return logits

    def prefill(self, seq: SequenceCache, prompt: list[int], timer=NULL_TIMER, all_logits=False,
                progress: Callable[[int, int], None] | None = None):
        outs = []
        for c0 in range(0, len(prompt), self.chunk_size):
            outs.append(self.forward(seq, prompt[c0:c0 + self.chunk_size], timer, all_logits))
            if progress:
                progress(min(c0 + self.chunk_size, len(prompt)), len(prompt))
        return torch.cat(outs) if all_logits else outs[-1]

    def stream(self, prompt, params: SamplingParams | None = None, eos_ids=()) -> Iterator[int]:
        """Generated token ids one at a time, each as soon as it is sampled (used by bench). Takes
        what generate() takes. Generation stops at params.stop_token_ids and, unless
        params.ignore_eos, at config.eos_token_id and `eos_ids` (e.g. the tokenizer's), as in
        generate() and GPUEngine. Bad arguments raise here, not at the first next(). The finish
        reason and timings are not reported: generate(on_token=...) streams and returns both."""
        prompt, params, eos_ids = self._check_request(prompt, params, eos_ids)
        return self._generate(prompt, params, eos_ids, lambda _result: None)

    def generate(self, prompt, params: SamplingParams | None = None, eos_ids=(),
                 on_token: Callable[[int], bool | None] | None = None,
                 prefill_progress: Callable[[int, int], None] | None = None) -> GenerationResult:
        """Generate for one prompt and return its GenerationResult.

        prompt: token ids (a list of ints, or a 1-D integer tensor/array), e.g. Tokenizer.encode(text).
        params: SamplingParams (None = the defaults: greedy, 64 new tokens). eos_ids: an int or
        ints that also end generation unless params.ignore_eos (stop_token_ids() gives the set
        `salactl run` uses; config.eos_token_id always applies). on_token(id): called with each
        token as it is sampled; returning True ends generation after that token with finish_reason
        "stop" (how a stop string ends it: GeneratedText.stopped). prefill_progress(done, total):
        called after each prefill chunk."""
        check_callback(on_token, "on_token")
        check_callback(prefill_progress, "prefill_progress")
        prompt, params, eos_ids = self._check_request(prompt, params, eos_ids)
        box: list[GenerationResult] = []
        for _ in self._generate(prompt, params, eos_ids, box.append, prefill_progress, on_token):
            pass
        return box[0]

    def _check_request(self, prompt, params, eos_ids):
        """(prompt ids, SamplingParams, eos ids) as generation takes them, or a UsageError."""
        prompt, params = check_prompt(prompt, self.config.vocab_size), resolve_params(params)
        eos_ids = as_token_ids(eos_ids, "eos_ids")
        check_ending_ids(params.stop_token_ids + eos_ids, self.config.vocab_size)
        warn_model_limits(self.config, len(prompt), params.max_new_tokens)
        return prompt, params, eos_ids

    def _generate(self, prompt, params, eos_ids, deliver, prefill_progress=None, on_token=None):
        """The tokens of one generation, its GenerationResult to `deliver` at the end; the
        arguments are checked already (_check_request). on_token: as generate() takes it."""
        stops = ending_token_ids(self.config, params, eos_ids)
        processors = logits_processors(params, prompt, stops, self.config.vocab_size, self.device)
        gen = None
        if params.temperature > 0:
            gen = torch.Generator(device=self.device).manual_seed(params.seed if params.seed is not None else 0)
        seq = self.new_sequence()
        pre, dec = PhaseStats(), PhaseStats()
        timer = OpTimer(self.device) if self.time_ops else NULL_TIMER
        synchronize(self.device)
        t0 = time.perf_counter()
        logits = self.prefill(seq, prompt, timer, progress=prefill_progress)
        out: list[int] = []
        finish = "length"
        if params.max_new_tokens > 0:
            tok = sample(logits[-1], params, gen, processors)     # reads the logits: an implicit sync
        synchronize(self.device)
        ttft = time.perf_counter() - t0
        pre.tokens, pre.forward_calls, pre.seconds = len(prompt), -(-len(prompt) // self.chunk_size), ttft
        if self.time_ops:
            pre.op_seconds = timer.totals()
            timer.reset()
        t1 = time.perf_counter()
        while len(out) < params.max_new_tokens:
            out.append(tok)
            yield tok
            asked_to_stop = on_token is not None and on_token(tok) is True
            if tok in stops or asked_to_stop:
                finish = "stop"
                break
            if len(out) == params.max_new_tokens:
                break
            logits = self.forward(seq, [tok], timer)
            dec.forward_calls += 1
            tok = sample(logits[-1], params, gen, processors)
        synchronize(self.device)
        dec.seconds = time.perf_counter() - t1 if len(out) > 1 else 0.0
        dec.tokens = dec.forward_calls
        if self.time_ops:
            dec.op_seconds = timer.totals()
        deliver(GenerationResult(list(prompt), out, finish, ttft if out else None, pre, dec))

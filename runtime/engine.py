"""Single-process generation engine: chunked prefill, then decode, over any attention backend.
Used by `salactl run` / `eval` on CPU and as the correctness baseline for the GPU engine."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Iterator

import torch

from salactl.errors import UsageError
from salactl.runtime.backend_reference import ReferenceBackend
from salactl.runtime.batch import ForwardBatch
from salactl.runtime.cache import SequenceCache
from salactl.runtime.device_sync import synchronize
from salactl.runtime.kv_fp8 import model_kv_scales, resolve_kv_scales
from salactl.runtime.op_timer import NULL_TIMER, OpTimer
from salactl.runtime.sampling import SamplingParams, sample


@dataclass
class PhaseStats:
    tokens: int = 0
    forward_calls: int = 0
    seconds: float = 0.0
    op_seconds: dict[str, float] = field(default_factory=dict)


@dataclass
class GenerationResult:
    prompt_token_ids: list[int]
    output_token_ids: list[int]
    finish_reason: str
    ttft_s: float
    prefill: PhaseStats
    decode: PhaseStats


class Engine:
    def __init__(self, model, device, chunk_size: int = 512, backend=None, time_ops: bool = False,
                 kv_cache_dtype: str = "bf16"):
        if chunk_size <= 0:
            raise UsageError(f"--chunk-size must be positive, got {chunk_size}")
        self.model, self.config = model, model.config
        self.device = torch.device(device)
        self.dtype = model.model.embed_tokens.weight.dtype    # never quantized, unlike lm_head
        self.chunk_size = chunk_size
        self.backend = backend or ReferenceBackend(self.config)
        self.time_ops = time_ops
        # fp8 KV: calibrated scales from the checkpoint (runtime/kv_fp8.py says what happens without)
        self.kv_cache_dtype = kv_cache_dtype
        self.kv_scales = resolve_kv_scales(self.config, kv_cache_dtype, model_kv_scales(model), self.device)

    def new_sequence(self) -> SequenceCache:
        return SequenceCache(self.config, self.device, self.dtype, kv_cache_dtype=self.kv_cache_dtype,
                             kv_scales=self.kv_scales)

    @torch.inference_mode()
    def forward(self, seq: SequenceCache, token_ids: list[int], timer=NULL_TIMER, all_logits: bool = False):
        """Run new tokens of one sequence through the model; returns fp32 logits
        (last row only unless all_logits)."""
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

    def stream(self, prompt: list[int], params: SamplingParams,
               eos_ids: tuple[int, ...] = ()) -> Iterator[int]:
        """Generated token ids one at a time (used by bench). Generation stops at
        params.stop_token_ids and, unless params.ignore_eos, at config.eos_token_id and `eos_ids`
        (e.g. the tokenizer's), as in generate() and GPUEngine. A bad prompt raises here, not at
        the first next()."""
        self._check_prompt(prompt)
        return self._generate(prompt, params, eos_ids, lambda _result: None)

    def generate(self, prompt: list[int], params: SamplingParams, eos_ids: tuple[int, ...] = (),
                 on_token: Callable[[int], None] | None = None,
                 prefill_progress: Callable[[int, int], None] | None = None) -> GenerationResult:
        self._check_prompt(prompt)
        box: list[GenerationResult] = []
        for tok in self._generate(prompt, params, eos_ids, box.append, prefill_progress):
            if on_token:
                on_token(tok)
        return box[0]

    def _check_prompt(self, prompt: list[int]) -> None:
        if not prompt:
            raise UsageError("the prompt is empty; give at least one token")
        vocab = self.config.vocab_size
        bad = [t for t in prompt if not 0 <= t < vocab]
        if bad:
            raise UsageError(f"prompt token id {bad[0]} is outside the vocabulary (size {vocab})")

    def _generate(self, prompt, params, eos_ids, deliver, prefill_progress=None):
        """The tokens of one generation, its GenerationResult to `deliver` at the end; the
        prompt is checked already (_check_prompt)."""
        eos = set() if params.ignore_eos else set(eos_ids) | set(self.config.eos_token_id)
        stops = set(params.stop_token_ids) | eos
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
            tok = sample(logits[-1], params, gen)      # sampling reads the logits: an implicit sync
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
            if tok in stops:
                finish = "stop"
                break
            if len(out) == params.max_new_tokens:
                break
            logits = self.forward(seq, [tok], timer)
            dec.forward_calls += 1
            tok = sample(logits[-1], params, gen)
        synchronize(self.device)
        dec.seconds = time.perf_counter() - t1 if len(out) > 1 else 0.0
        dec.tokens = dec.forward_calls
        if self.time_ops:
            dec.op_seconds = timer.totals()
        deliver(GenerationResult(list(prompt), out, finish, ttft, pre, dec))

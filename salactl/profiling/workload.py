"""The profiled work: a model with caches already holding `context` tokens (synthesised with
random keys/values/states, which cost the same bytes as real ones, and the compressed keys a
prefill of them would have built), and one forward step of a
phase, plus the analytic bytes/FLOPs of exactly that step (salactl/profiling/analytic.py over
runtime/roofline.py call_costs)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from salactl.profiling.analytic import scoped_costs, sum_scopes
from salactl.profiling.preflight import check_backend, check_layers
from salactl.profiling.ranges import add_layer_ranges
from salactl.profiling.spec import ProfileSpec
from salactl.quant.in_memory import QUANTIZED_BITS, quantize_rtn_in_memory, quantized_as
from salactl.runtime.backend_reference import ReferenceBackend
from salactl.runtime.batch import ForwardBatch
from salactl.runtime.cache import SequenceCache
from salactl.runtime.loader import load_model
from salactl.runtime.op_timer import NULL_TIMER
from salactl.runtime.ops.selection import num_windows


def _cache_kwargs(spec: ProfileSpec, model, config, device) -> dict:
    """The FP8 cache's dtype and per-head scales: a checkpoint's calibrated ones as run and bench
    resolve them, else 1.0. The scale values do not change the work profiled, so fp8_e4m3 profiles
    a model without calibrated scales too (run and bench refuse that, for its outputs' sake)."""
    from salactl.runtime.kv_fp8 import fp8_dtype, model_kv_scales, resolve_kv_scales

    if fp8_dtype(spec.kv_cache_dtype) is None:
        return {}
    calibrated = model_kv_scales(model)
    policy = spec.kv_cache_dtype if calibrated else "fp8_e5m2"        # e5m2's: 1.0 where uncalibrated
    return {"kv_cache_dtype": spec.kv_cache_dtype,
            "kv_scales": resolve_kv_scales(config, policy, calibrated, device)}


@dataclass
class Workload:
    spec: ProfileSpec
    model: object
    config: object
    device: torch.device
    dtype: torch.dtype
    kv_bytes: int
    source: str
    backend: object
    seqs: dict

    backend_name = "reference"

    def layer_ranges(self, ranges) -> list:
        return add_layer_ranges(self.model, ranges)

    def prepare(self, phase: str, timer=NULL_TIMER):
        """Token ids and the ForwardBatch of one step (kept out of the profiled range)."""
        seqs = self.seqs[phase]
        for seq in seqs:            # an earlier step's K1 windows: not this step's to skip
            uncommit_k1(seq)
        new, _ = self.spec.step_rows(phase)
        gen = torch.Generator(device=self.device).manual_seed(self.spec.seed + 1)
        ids = torch.randint(0, self.config.vocab_size, (new * len(seqs),), device=self.device,
                            generator=gen)
        batch = ForwardBatch.build(self.config, seqs, [new] * len(seqs), self.backend, self.device, timer)
        return ids, batch, batch.last_rows()

    @torch.inference_mode()
    def forward(self, prepared) -> torch.Tensor:
        """One forward call of every sequence. It is not committed (cache lengths stay put, and
        prepare drops the compressed keys it adds), so repeated steps (warm-up, then the profiled
        one) do identical work: that of a real step at this context, whatever --warmup is."""
        ids, batch, rows = prepared
        return self.model(ids, batch, rows)

    def step(self, phase: str, timer=NULL_TIMER) -> torch.Tensor:
        return self.forward(self.prepare(phase, timer))

    def scoped_analytic(self, phase: str) -> dict[str, dict[str, dict]]:
        new, cached = self.spec.step_rows(phase)
        act = torch.finfo(self.dtype).bits // 8
        return scoped_costs(self.config, self.model, [(new, cached)] * self.spec.batch,
                            self.spec.batch, act, self.kv_bytes)

    def analytic(self, phase: str) -> dict[str, dict]:
        """Per op class, over the scopes the profile covers (all of them without --layers)."""
        return sum_scopes(self.scoped_analytic(phase), self.spec.scopes)


# tokens of synthetic keys/values drawn (and compressed) at a time: the fill's temporaries stay a few
# MB at any --context, beside caches that may take most of the memory
FILL_SLICE = 8192


def committed_windows(config, length: int) -> int:
    """The compressed keys (K1 windows) a sequence holds after an engine prefilled `length` tokens:
    every full window once its last prefill chunk had a sparse row (length >= dense_len), else none
    (dense rows never compress, so the first sparse step compresses them all)."""
    sc = config.sparse_config
    return num_windows(length, sc) if length >= sc.dense_len else 0


def uncommit_k1(seq) -> None:
    """Drop the K1 windows a step (warm-up or profiled, never committed) added past the committed
    length, so the next step compresses its own tokens' windows as a real step at that context
    does."""
    seq.drop_compressed_keys_past(committed_windows(seq.config, seq.length))


def _fill_layer(seq, layer: int, cached: int, gen, k1: bool) -> None:
    """`cached` random keys/values, drawn in the cache's activation dtype FILL_SLICE tokens at a
    time, and (k1) their compressed keys, built slice by slice as a chunked prefill builds them."""
    config = seq.config
    shape = (config.num_key_value_heads, config.head_dim)
    for start in range(0, cached, FILL_SLICE):
        n = min(FILL_SLICE, cached - start)
        k = torch.randn(n, *shape, device=seq.device, dtype=seq.dtype, generator=gen)
        v = torch.randn(n, *shape, device=seq.device, dtype=seq.dtype, generator=gen)
        seq.length = start
        keys, _ = seq.append_kv(layer, k, v)
        if k1:
            seq.compressed_keys(layer, keys)


def _sequences(config, device, dtype, batch: int, cached: int, new: int, seed: int, cache_kw: dict):
    gen = torch.Generator(device=device).manual_seed(seed)
    h, dk = config.lightning_nh, config.lightning_head_dim
    k1 = committed_windows(config, cached) > 0
    seqs = []
    for _ in range(batch):
        seq = SequenceCache(config, device, dtype, capacity=cached + new, **cache_kw)
        if cached:
            for layer in config.sparse_layers:
                _fill_layer(seq, layer, cached, gen, k1)
            for layer in config.lightning_layers:
                seq.state[layer] = 0.01 * torch.randn(h, dk, dk, device=device, generator=gen)
        seq.length = cached
        seqs.append(seq)
    return seqs


def build(spec: ProfileSpec) -> Workload:
    spec = spec.with_checkpoint_weights()
    lm = load_model(spec.model, spec.device, spec.dtype, spec.random_weights, spec.seed)
    model, config = lm.model, lm.config
    check_layers(spec, config)
    if not quantized_as(model) and spec.weights in QUANTIZED_BITS:
        model = quantize_rtn_in_memory(model, config, bits=QUANTIZED_BITS[spec.weights])
    device = model.device
    dtype = model.model.embed_tokens.weight.dtype
    cache_kw = _cache_kwargs(spec, model, config, device)
    kv_bytes = 1 if cache_kw else torch.finfo(dtype).bits // 8
    w = Workload(spec, model, config, device, dtype, kv_bytes, lm.source, ReferenceBackend(config), {})
    if check_backend(spec, device):
        from salactl.profiling.engine_workload import build_engine_workload

        return build_engine_workload(w)
    for phase in spec.phases:
        new, cached = spec.step_rows(phase)
        w.seqs[phase] = _sequences(config, device, dtype, spec.batch, cached, new, spec.seed, cache_kw)
    return w

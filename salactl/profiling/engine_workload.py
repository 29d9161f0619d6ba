"""The profiled step run by the GPU engine (fused model, paged caches, Triton kernels) instead of
the reference backend: what `salactl run` and `bench` execute on CUDA, with ~10x fewer kernels
than the eager reference step (so a whole 9B decode step fits an Nsight Compute session).

The cache is real: each phase's cached tokens (random ids) are prefilled through the engine, into
that phase's own request slots, before any profiled step. Each profiled step is run eagerly (no
CUDA graph, so the NVTX op ranges hold) on the same tokens at the same positions, so the cache
does not grow and warm-up and profiled steps do the same work (each step does advance the
lightning layers' recurrent state and rewrite its K/V at those positions: values change, the work
does not). Decoder-layer ranges open at the attention block and close after the MLP (the fused
forward calls those two modules, not the layer module)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from salactl import output
from salactl.profiling.ranges import LAYER_PREFIX
from salactl.profiling.workload import Workload
from salactl.runtime.op_timer import NULL_TIMER


@dataclass
class EngineWorkload(Workload):
    engine: object = None
    slots: dict = None          # phase -> request slots whose caches hold that phase's context
    backend_name = "engine"

    def prepare(self, phase: str, timer=NULL_TIMER):
        new, cached = self.spec.step_rows(phase)
        gen = torch.Generator().manual_seed(self.spec.seed + 1)
        slots = self.slots[phase]
        ids = torch.randint(0, self.config.vocab_size, (len(slots), new), generator=gen).tolist()
        return phase, [(s, toks, cached) for s, toks in zip(slots, ids)], timer

    @torch.inference_mode()
    def forward(self, prepared) -> torch.Tensor:
        phase, segments, timer = prepared
        runner = self.engine.runner
        if phase == "decode":
            return runner.decode([(s, toks[0], p) for s, toks, p in segments], timer)
        return runner.prefill(segments, timer)

    def scoped_analytic(self, phase: str) -> dict[str, dict[str, dict]]:
        from salactl.profiling.analytic import gates_in_qkv_layers, scoped_costs

        new, cached = self.spec.step_rows(phase)
        act = torch.finfo(self.dtype).bits // 8
        return scoped_costs(self.config, self.model, [(new, cached)] * self.spec.batch, self.spec.batch, act,
                            self.kv_bytes, gates_in_qkv=gates_in_qkv_layers(self.model))

    def layer_ranges(self, ranges) -> list:
        handles = []
        for i, layer in enumerate(self.model.model.layers):
            name = f"{LAYER_PREFIX}{i}"
            handles.append(layer.self_attn.register_forward_pre_hook(lambda m, a, n=name: ranges.push(n)))
            handles.append(layer.mlp.register_forward_hook(lambda m, a, o: ranges.pop()))
        return handles


def _row_pages(spec, block_size: int) -> int:
    """Each profiled row's whole pages: its context, a chunk and a page of slack."""
    return -(-(spec.context + max(spec.chunk_size, 1) + block_size) // block_size)


def engine_sizes(spec, config) -> dict:
    """GPUEngine's sizing arguments for the profile's rows (batch per phase), which the preflight
    checks before loading (preflight.check_engine_memory)."""
    B = config.sparse_config.block_size
    rows = spec.batch * len(spec.phases)
    return {"max_running_requests": rows, "chunk_size": min(16384, max(spec.context, spec.chunk_size)),
            "kv_tokens": rows * _row_pages(spec, B) * B}


def _uncalibrated_scales_at_one(model, config, kv_cache_dtype: str) -> None:
    """The reference backend's policy (workload._cache_kwargs): an FP8 cache of a model without
    calibrated scales runs at 1.0. GPUEngine reads scales only from the model's self_attn.k_scale /
    v_scale buffers and refuses fp8_e4m3 without them, so they are registered here as 1.0."""
    from salactl.runtime.kv_fp8 import fp8_dtype, model_kv_scales

    if fp8_dtype(kv_cache_dtype) is None or model_kv_scales(model):
        return
    device = model.model.embed_tokens.weight.device
    for i in config.sparse_layers:
        attn = model.model.layers[i].self_attn
        attn.register_buffer("k_scale", torch.ones((), device=device))
        attn.register_buffer("v_scale", torch.ones((), device=device))


def build_engine_workload(w: Workload) -> EngineWorkload:
    """Same model and spec as the reference workload `w`; caches filled by real prefill."""
    from salactl.runtime.gpu.engine import GPUEngine

    spec, cfg = w.spec, w.config
    row_pages = _row_pages(spec, cfg.sparse_config.block_size)
    _uncalibrated_scales_at_one(w.model, cfg, spec.kv_cache_dtype)
    engine = GPUEngine(w.model, w.device, cuda_graph=False, kv_cache_dtype=spec.kv_cache_dtype, eos_ids=(),
                       **engine_sizes(spec, cfg))
    for note in engine.fallback_notes():
        output.warn_once(note)
    step = engine.scheduler.chunk_tokens
    gen = torch.Generator().manual_seed(spec.seed)
    slots = {}
    for phase in spec.phases:
        cached = spec.step_rows(phase)[1]
        slots[phase] = tuple(engine.scheduler.slots.alloc(spec.batch))
        for s in slots[phase]:
            engine.pools.assign_pages(s, engine.scheduler.pages.alloc(row_pages))
            engine.pools.state[:, s].zero_()
            engine.backend.release_slot(s)
            ids = torch.randint(0, cfg.vocab_size, (cached,), generator=gen).tolist()
            for p0 in range(0, cached, step):
                engine.runner.prefill([(s, ids[p0:p0 + step], p0)])
    return EngineWorkload(spec, engine.model, cfg, w.device, w.dtype, w.kv_bytes, w.source, engine.backend,
                          {}, engine=engine, slots=slots)

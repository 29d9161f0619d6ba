"""The profiled work: a model with caches already holding `context` tokens (synthesised with
random keys/values/states, which cost the same bytes as real ones), and one forward step of a
phase, plus the analytic bytes/FLOPs of exactly that step (runtime/roofline.py call_costs)."""

from __future__ import annotations

import inspect
from dataclasses import dataclass

import torch

from salactl.errors import ConfigError, UsageError
from salactl.profiling.spec import ProfileSpec
from salactl.runtime.backend_reference import ReferenceBackend
from salactl.runtime.batch import ForwardBatch
from salactl.runtime.cache import SequenceCache
from salactl.runtime.loader import load_model
from salactl.runtime.op_timer import NULL_TIMER
from salactl.runtime.roofline import OP_CLASSES, call_costs, linear_costs


def is_w4a16(model) -> bool:
    return any(hasattr(m, "qweight") for m in model.modules())


def _quantize_in_memory(model, group_size: int = 128):
    """W4A16 for random/bf16 weights comes from salactl.quant (another part of the project)."""
    try:
        from salactl.quant import rtn  # type: ignore[attr-defined]
    except ImportError:
        rtn = None
    fn = getattr(rtn, "quantize_model_rtn", None) if rtn else None
    if fn is None:
        raise UsageError("--weights w4a16 needs salactl.quant's in-memory W4A16 quantizer, which this "
                         "build lacks; pass a GPTQ checkpoint directory as --model instead")
    return fn(model, group_size=group_size)


def _kv_dtype(spec: ProfileSpec, act_dtype: torch.dtype) -> torch.dtype:
    if spec.kv_cache_dtype in ("auto", "bf16"):
        return act_dtype
    if "kv_dtype" not in inspect.signature(SequenceCache.__init__).parameters:
        raise UsageError(f"--kv-cache-dtype {spec.kv_cache_dtype} needs an FP8 KV cache in the runtime, "
                         "which this build lacks; use --kv-cache-dtype bf16")
    return {"fp8_e4m3": torch.float8_e4m3fn, "fp8_e5m2": torch.float8_e5m2}[spec.kv_cache_dtype]


@dataclass
class Workload:
    spec: ProfileSpec
    model: object
    config: object
    device: torch.device
    dtype: torch.dtype
    kv_dtype: torch.dtype
    source: str
    backend: object
    seqs: dict

    def step(self, phase: str, timer=NULL_TIMER) -> torch.Tensor:
        """One forward call of `phase` for every sequence. The step is not committed (cache
        lengths stay put), so repeated steps (warm-up, then the profiled one) do identical work."""
        seqs = self.seqs[phase]
        new, cached = self.spec.step_rows(phase)
        gen = torch.Generator(device=self.device).manual_seed(self.spec.seed + 1)
        ids = torch.randint(0, self.config.vocab_size, (new * len(seqs),), device=self.device,
                            generator=gen)
        with torch.inference_mode():
            batch = ForwardBatch.build(self.config, seqs, [new] * len(seqs), self.backend, self.device,
                                       timer)
            logits = self.model(ids, batch, batch.last_rows())
        return logits

    def analytic(self, phase: str) -> dict[str, dict]:
        new, cached = self.spec.step_rows(phase)
        act = torch.finfo(self.dtype).bits // 8
        kv = torch.finfo(self.kv_dtype).bits // 8
        costs = call_costs(self.config, linear_costs(self.model), [(new, cached)] * self.spec.batch,
                           self.spec.batch, act_bytes=act, kv_bytes=kv)
        return {op: {"bytes": costs[op].bytes, "flops": costs[op].flops} for op in OP_CLASSES}


def _sequences(config, device, dtype, kv_dtype, batch: int, cached: int, new: int, seed: int):
    gen = torch.Generator(device=device).manual_seed(seed)
    hkv, d = config.num_key_value_heads, config.head_dim
    h, dk = config.lightning_nh, config.lightning_head_dim
    kw = {} if kv_dtype == dtype else {"kv_dtype": kv_dtype}
    seqs = []
    for _ in range(batch):
        seq = SequenceCache(config, device, dtype, capacity=cached + new, **kw)
        if cached:
            for layer in config.sparse_layers:
                k = torch.randn(cached, hkv, d, device=device, generator=gen).to(dtype)
                v = torch.randn(cached, hkv, d, device=device, generator=gen).to(dtype)
                seq.append_kv(layer, k, v)
            for layer in config.lightning_layers:
                seq.state[layer] = 0.01 * torch.randn(h, dk, dk, device=device, generator=gen)
        seq.length = cached
        seqs.append(seq)
    return seqs


def build(spec: ProfileSpec) -> Workload:
    lm = load_model(spec.model, spec.device, spec.dtype, spec.random_weights, spec.seed)
    model = lm.model
    quantized = is_w4a16(model)
    if spec.weights == "w4a16" and not quantized:
        model = _quantize_in_memory(model)
    elif spec.weights == "bf16" and quantized:
        raise ConfigError(f"{spec.model} is a W4A16 checkpoint; pass --weights w4a16")
    device = model.model.embed_tokens.weight.device
    dtype = model.model.embed_tokens.weight.dtype
    kv_dtype = _kv_dtype(spec, dtype)
    seqs = {}
    for phase in spec.phases:
        new, cached = spec.step_rows(phase)
        seqs[phase] = _sequences(lm.config, device, dtype, kv_dtype, spec.batch, cached, new, spec.seed)
    return Workload(spec, model, lm.config, device, dtype, kv_dtype, lm.source,
                    ReferenceBackend(lm.config), seqs)

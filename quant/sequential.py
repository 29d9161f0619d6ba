"""Layer-by-layer GPTQ over our own model (reference/quantization.md §1 "Sequential pass").

Per decoder layer, in true-sequential order, with the calibration inputs of that layer:
  1. q/k/v + the output gate (o_gate / z_proj): one shared input (input_layernorm(h)), one Hessian
  2. o_proj (its input depends on the quantized q/k/v/gates)
  3. gate/up (shared input post_attention_layernorm(h'))
  4. down
Each Hessian is captured by running the layer (through ForwardBatch + the reference backend with a
per-sample cache holding only that layer) up to the first member, where a pre-hook stops it. The
layer's weights are replaced by their dequantized values as soon as they are solved, so later
groups and the next layer see the quantized model. A final full pass gives the next layer's
inputs and, for FP8 KV, the per-layer amax of K and V. Given the source checkpoint's tensors, each
linear is quantized from its stored weight (in fp32), not from the model's copy in the calibration
dtype.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from typing import Callable

import torch

from salactl.errors import QuantizationError, UsageError
from salactl.quant.defaults import DEFAULT_DAMP
from salactl.quant.gptq import Hessian, gptq_quantize, overflow_error, prepare_hessian
from salactl.quant.packing import to_gptq_tensors
from salactl.quant.quantizer import QuantizedWeight, QuantSpec, output_error
from salactl.quant.rtn import rtn_quantize
from salactl.runtime.backend_reference import ReferenceBackend
from salactl.runtime.batch import ForwardBatch
from salactl.runtime.cache import SequenceCache
from salactl.runtime.checkpoint import StoredTensors, expected_tensor_shapes
from salactl.runtime.config import SPARSE
from salactl.runtime.device_sync import synchronize
from salactl.runtime.kv_fp8 import fp8_dtype, scales_from_amax
from salactl.runtime.ops.attention import attention, sdpa

METHODS = ("gptq", "rtn")
_SPARSE_GROUPS = (("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_gate"),
                  ("self_attn.o_proj",), ("mlp.gate_proj", "mlp.up_proj"), ("mlp.down_proj",))
_LIGHTNING_GROUPS = (("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.z_proj"),
                     ("self_attn.o_proj",), ("mlp.gate_proj", "mlp.up_proj"), ("mlp.down_proj",))
# vLLM/SGLang fuse these on load; all members must share one quantized/unquantized state.
FUSED = (("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"), ("mlp.gate_proj", "mlp.up_proj"))


@dataclass(frozen=True)
class QuantOptions:
    """`salactl quantize`'s options with its defaults; a bad value is a UsageError. desc_act
    (act-order with static groups), damp and clip_search (Hessian-weighted clip search of the group
    scales) only change GPTQ's solve, so any other method stores them as False and the default damp (build GPTQ options anew rather than
    dataclasses.replace(rtn_options, method="gptq"), which keeps those)."""

    bits: int = 4
    group_size: int = 128
    method: str = "gptq"
    desc_act: bool = True
    damp: float = DEFAULT_DAMP
    kv_cache_dtype: str = "bf16"
    kv_scales_per_head: bool = False
    batch_tokens: int = 16384        # calibration tokens per forward call
    clip_search: bool = True

    def __post_init__(self) -> None:
        try:
            QuantSpec(self.bits, self.group_size)
        except QuantizationError as e:      # here a bad option value, not a failed quantization
            raise UsageError(str(e)) from None
        if self.method not in METHODS:
            raise UsageError(f"method (--method) {self.method!r} is unknown; valid: {', '.join(METHODS)}")
        if not 0 < self.damp < 1:
            raise UsageError(f"damp (--damp) must be in (0, 1), got {self.damp}")
        fp8 = fp8_dtype(self.kv_cache_dtype)
        if self.kv_scales_per_head and fp8 is None:
            raise UsageError("kv_scales_per_head (--kv-scales-per-head) sets the FP8 KV scales; add "
                             "--kv-cache-dtype fp8_e4m3 or fp8_e5m2, or drop it")
        if self.method != "gptq":
            object.__setattr__(self, "desc_act", False)
            object.__setattr__(self, "damp", DEFAULT_DAMP)
            object.__setattr__(self, "clip_search", False)
        if self.batch_tokens < 1:
            raise UsageError(f"batch_tokens (--batch-tokens) must be positive, got {self.batch_tokens}")

    @property
    def spec(self) -> QuantSpec:
        return QuantSpec(self.bits, self.group_size)


@dataclass
class ModuleReport:
    name: str
    out_features: int
    in_features: int
    damp: float | None
    rtn_error: float | None       # ‖WX − QX‖/‖WX‖ of round-to-nearest
    error: float | None           # the same for the chosen method
    seconds: float                # its weight load, solve, error metrics and packing (a jointly solved
                                  # group's load and solve split by rows): together, the solve time


@dataclass
class QuantizeOutcome:
    quantized: dict[str, dict[str, torch.Tensor]]      # prefix -> GPTQ tensors (CPU)
    skipped: dict[str, str]                            # prefix -> why it stays unquantized
    reports: list[ModuleReport]
    kv_scales: dict | None
    forward_seconds: float = 0.0
    solve_seconds: float = 0.0
    damp_raised: list[str] = field(default_factory=list)


def marlin_violation(out_features: int, in_features: int, group_size: int) -> str | None:
    if out_features % 64:
        return f"out_features {out_features} % 64 != 0"
    if in_features % 128:
        return f"in_features {in_features} % 128 != 0"
    if group_size != -1 and in_features % group_size:
        return f"in_features {in_features} % group_size {group_size} != 0"
    return None


def layer_groups(config, i: int):
    return _SPARSE_GROUPS if config.mixer_types[i] == SPARSE else _LIGHTNING_GROUPS


def layer_linears(config, i: int) -> list[str]:
    """The linears of decoder layer i, in layer_groups' order."""
    return [n for g in layer_groups(config, i) for n in g]


def skip_plan(config, group_size: int,
              shape: Callable[[str], tuple[int, int]] | None = None) -> dict[str, str]:
    """Linears (by prefix) that stay unquantized because they, or a linear fused with them (FUSED),
    break Marlin's rules: the one rule of `salactl quantize` and of the memory report.
    shape(prefix) is a linear's (out, in); by default the config's (expected_tensor_shapes)."""
    if shape is None:
        shapes = expected_tensor_shapes(config)
        shape = lambda prefix: shapes[prefix + ".weight"]      # noqa: E731
    skipped: dict[str, str] = {}
    for i in range(config.num_hidden_layers):
        p = f"model.layers.{i}."
        for n in layer_linears(config, i):
            why = marlin_violation(*shape(p + n), group_size)
            if why:
                skipped[p + n] = why
        for fused in FUSED:
            bad = [n for n in fused if p + n in skipped]
            for n in fused:
                if bad and p + n not in skipped:
                    skipped[p + n] = f"fused with {bad[0]}, which breaks Marlin's rules"
    return skipped


def quantized_linears(config, group_size: int) -> list[str]:
    """The decoder linears (by prefix) a GPTQ checkpoint of `config` holds quantized: all that
    skip_plan does not skip."""
    skipped = skip_plan(config, group_size)
    prefixes = (f"model.layers.{i}.{n}" for i in range(config.num_hidden_layers)
                for n in layer_linears(config, i))
    return [p for p in prefixes if p not in skipped]


def widest_quantized_input(config, group_size: int) -> int:
    """The largest in_features of the linears quantized_linears quantizes (0 if none)."""
    shapes = expected_tensor_shapes(config)
    return max((shapes[p + ".weight"][1] for p in quantized_linears(config, group_size)), default=0)


def plan_skips(model, config, group_size: int) -> dict[str, str]:
    """skip_plan with the shapes of `model`'s own linears."""
    def shape(prefix: str) -> tuple[int, int]:
        m = model.get_submodule(prefix)
        return m.out_features, m.in_features

    return skip_plan(config, group_size, shape)


class _Stop(Exception):
    """Raised by a capture hook: the rest of the layer is not needed for this pass."""


class _KVAmaxBackend(ReferenceBackend):
    """The reference backend, recording amax(|K|), amax(|V|) per sparse layer and KV head. On CPU its
    attention is the fused SDPA op (the same math; sala-nano's calibration forwards 366 -> 215 s); on
    a GPU the reference op stays (9B on the H200: 205 s of forwards with it, 222 s with SDPA)."""

    def __init__(self, config, device: torch.device):
        super().__init__(config, attention_op=sdpa.attention if device.type == "cpu" else attention)
        self.amax: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    def softmax_attention(self, layer, q, k, v, batch):
        ka, va = k.detach().abs().float().amax(dim=(0, 2)), v.detach().abs().float().amax(dim=(0, 2))
        if layer in self.amax:
            ka, va = torch.maximum(ka, self.amax[layer][0]), torch.maximum(va, self.amax[layer][1])
        self.amax[layer] = (ka, va)
        return super().softmax_attention(layer, q, k, v, batch)


# Tokens of one sequence per layer call: longer sequences go through a layer in chunks, with
# their KV / GLA state cached like a chunked prefill (the same result: DESIGN.md §2 is chunking
# invariant), so the attention's [heads, chunk, T] scores stay bounded at any --seqlen.
CHUNK_TOKENS = 2048


class _LayerRunner:
    def __init__(self, config, batch_tokens: int, backend):
        self.config, self.batch_tokens, self.backend = config, batch_tokens, backend

    def run(self, layer, idx: int, inps: torch.Tensor, out: torch.Tensor | None = None) -> None:
        S, T, hidden = inps.shape
        chunk = min(T, CHUNK_TOKENS, self.batch_tokens)
        per = max(1, self.batch_tokens // chunk)
        for s0 in range(0, S, per):
            x = inps[s0:s0 + per]
            b = x.shape[0]
            seqs = [SequenceCache(self.config, x.device, x.dtype, capacity=T, layers={idx}) for _ in range(b)]
            for c0 in range(0, T, chunk):
                n = min(chunk, T - c0)
                batch = ForwardBatch.build(self.config, seqs, [n] * b, self.backend, x.device)
                try:
                    y = layer(x[:, c0:c0 + n].reshape(b * n, hidden), batch)
                except _Stop:
                    # a capture hook stopped the layer: after its mixer (the caches hold this chunk),
                    # or before it (then the mixer never runs for any chunk, and the caches are unread)
                    y = None
                batch.commit()
                if out is not None and y is not None:
                    out[s0:s0 + b, c0:c0 + n] = y.view(b, n, hidden)

    def hessian(self, layer, idx: int, inps: torch.Tensor, modules: list[torch.nn.Module]) -> Hessian:
        h = Hessian(modules[0].in_features, inps.device)

        def hook(_mod, args):
            h.add(args[0])
            raise _Stop

        handles = [m.register_forward_pre_hook(hook) for m in modules]
        try:
            self.run(layer, idx, inps)
        finally:
            for hd in handles:
                hd.remove()
        return h


def solver_spec(opts: QuantOptions, config) -> QuantSpec:
    """opts.spec, with scales exact in bf16 too unless the checkpoint is stored in fp16: SGLang and
    vLLM serve a bf16 checkpoint in bf16, and vLLM a float32 one too (its default where the GPU has
    bf16), holding the scales in that dtype."""
    return replace(opts.spec, bf16_exact_scales=config.torch_dtype != "float16")


@torch.inference_mode()
def quantize_model(model, config, calib: torch.Tensor | None, opts: QuantOptions,
                   progress: Callable[[str], None] | None = None,
                   source: StoredTensors | None = None) -> QuantizeOutcome:
    """Quantize `model` in place (weights become their dequantized values) and return the checkpoint
    tensors. `calib` [S, T] token ids; None is allowed only for --method rtn without FP8 KV.
    `source`: the tensors of the checkpoint `model` was loaded from; each linear is then quantized
    from its stored weight rather than from the model's (which holds it in the dtype the calibration
    forwards run in)."""
    spec = solver_spec(opts, config)
    fp8 = fp8_dtype(opts.kv_cache_dtype) is not None
    if calib is None and (opts.method != "rtn" or fp8):
        raise QuantizationError("GPTQ and FP8 KV scale calibration need calibration data")
    skipped = plan_skips(model, config, opts.group_size)
    total = sum(len(g) for i in range(config.num_hidden_layers) for g in layer_groups(config, i))
    if len(skipped) == total:
        first = next(iter(skipped.items()))
        raise QuantizationError(f"no linear of this model can be quantized with group size {opts.group_size} "
                                f"(e.g. {first[0]}: {first[1]}); Marlin needs out % 64, in % 128 and in % group == 0")
    device = model.device
    outcome = QuantizeOutcome({}, skipped, [], None)
    backend = _KVAmaxBackend(config, device)
    runner = _LayerRunner(config, opts.batch_tokens, backend)
    inps = outs = None
    if calib is not None:
        inps = model.model.embed_tokens(calib.to(device)) * config.scale_emb
        outs = torch.empty_like(inps)
    for i, layer in enumerate(model.model.layers):
        for group in layer_groups(config, i):
            members = [n for n in group if f"model.layers.{i}.{n}" not in skipped]
            if not members:
                if progress:        # counted in the progress total all the same
                    progress(f"layer {i}: {', '.join(n.rsplit('.', 1)[-1] for n in group)} (unquantized)")
                continue
            mods = [layer.get_submodule(n) for n in members]
            t0 = time.perf_counter()
            h = runner.hessian(layer, i, inps, mods) if inps is not None else None
            synchronize(device)
            t1 = time.perf_counter()
            outcome.forward_seconds += t1 - t0
            _solve_group(i, members, mods, h, opts, spec, outcome, source)
            synchronize(device)
            outcome.solve_seconds += time.perf_counter() - t1
            if progress:
                progress(f"layer {i}: {', '.join(n.rsplit('.', 1)[-1] for n in members)}")
        if inps is not None:
            t0 = time.perf_counter()
            runner.run(layer, i, inps, outs)
            inps, outs = outs, inps
            synchronize(device)
            outcome.forward_seconds += time.perf_counter() - t0
    if fp8:
        outcome.kv_scales = scales_from_amax(backend.amax, opts.kv_cache_dtype, opts.kv_scales_per_head)
    return outcome


def _solve_group(i, members, mods, h: Hessian | None, opts: QuantOptions, spec: QuantSpec,
                 outcome: QuantizeOutcome, source: StoredTensors | None) -> None:
    name = f"model.layers.{i}.{members[0]}" + (f" (+{len(members) - 1} sharing its input)" if len(members) > 1 else "")
    t0 = time.perf_counter()
    W = torch.cat([_weight(f"model.layers.{i}.{n}", m, source) for n, m in zip(members, mods)])
    if not bool(torch.isfinite(W).all()):
        raise QuantizationError(f"{name} has NaN/Inf weights; the checkpoint is damaged (nothing was written)")
    prep = None
    if opts.method == "gptq":
        prep = prepare_hessian(h.h, opts.damp, opts.desc_act, name, h.act_dtype)
        if prep.damp > opts.damp:
            outcome.damp_raised.append(f"{name}: damp {opts.damp} -> {prep.damp}")
        solved = gptq_quantize(W, prep, spec, clip_search=opts.clip_search)
        rtn = rtn_quantize(W, spec)
    else:
        if h is not None and not bool(torch.isfinite(h.h).all()):
            raise overflow_error(name, h.act_dtype)
        solved = rtn = rtn_quantize(W, spec)
    if not bool(torch.isfinite(solved.scales).all()):
        raise QuantizationError(f"{name} has weights too large for fp16 group scales (|w| up to "
                                f"{W.abs().max().item():.3g}); it cannot be stored as GPTQ")
    synchronize(W.device)
    shared = time.perf_counter() - t0          # the group's load and solve, split by rows
    row = 0
    for n, m in zip(members, mods):
        t1 = time.perf_counter()
        rows = slice(row, row + m.out_features)
        row += m.out_features
        q: QuantizedWeight = solved.rows(rows.start, rows.stop)
        w = W[rows]
        err = rtn_err = None
        if h is not None:
            rtn_err = output_error(w, rtn.dequantized[rows], h.h)
            err = rtn_err if rtn is solved else output_error(w, q.dequantized, h.h)
        prefix = f"model.layers.{i}.{n}"
        packed = to_gptq_tensors(q.codes, q.scales, q.g_idx, spec.bits)
        outcome.quantized[prefix] = {k: t.cpu() for k, t in packed.items()}
        m.weight.copy_(q.dequantized.to(m.weight.dtype))
        synchronize(W.device)
        own = time.perf_counter() - t1
        outcome.reports.append(ModuleReport(prefix, m.out_features, m.in_features, prep.damp if prep else None,
                                            rtn_err, err, shared * m.out_features / W.shape[0] + own))


def _weight(prefix: str, module: torch.nn.Module, source: StoredTensors | None) -> torch.Tensor:
    """The fp32 weight to quantize: the source checkpoint's (one module in memory at a time), else the model's."""
    if source is None:
        return module.weight.float()
    return source[prefix + ".weight"].to(device=module.weight.device, dtype=torch.float32)

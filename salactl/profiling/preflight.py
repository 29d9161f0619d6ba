"""Checks of a ProfileSpec against the model and the machine before anything is loaded or
allocated: the device, dtype, model, --layers, --backend, and the memory the step's caches need
(a --context, --batch or --chunk-size too large fails here with exit 11, not in an allocator), and run's warning
where --context passes the model's trained length."""

from __future__ import annotations

from salactl.errors import CapacityError, DeviceError, UsageError
from salactl.units import human_bytes
from salactl.profiling.spec import ProfileSpec


def check_layers(spec: ProfileSpec, config) -> None:
    if spec.layers and max(spec.layers) >= config.num_hidden_layers:
        raise UsageError(f"--layers {max(spec.layers)} is out of range; the model has "
                         f"{config.num_hidden_layers} layers (0..{config.num_hidden_layers - 1})")


def check_backend(spec: ProfileSpec, device) -> bool:
    """Whether the GPU engine runs the step (--backend engine, or auto on CUDA with Triton)."""
    from salactl.runtime.gpu.available import gpu_engine_available

    usable = gpu_engine_available(device)
    if spec.backend == "engine" and not usable:
        raise DeviceError("--backend engine needs a CUDA GPU and triton (pip install 'salactl[gpu]'); "
                         "use --backend reference")
    return spec.backend != "reference" and usable


# fp32 [Hkv, G, n, W] tensors the reference selection holds at once for a step of n queries
# over W compressed keys (logits and their softmax, plus the summed scores' share)
SELECTION_TEMPORARIES = 3


def reference_attention_bytes(spec: ProfileSpec, config) -> int:
    """The reference backend's largest attention temporaries over the profiled steps: the step's
    block-selection window scores (a prefill chunk's gathered attention stays under ops/attention/
    gathered.py's ROW_GROUP_BYTES) and, for rows below dense_len, the dense scores over every cached
    key (bench/sweep_sizes.py's count, which the sweep and eval checks use too)."""
    from salactl.bench.sweep_sizes import SCORE_COPIES
    from salactl.runtime.ops.attention.gathered import ROW_GROUP_BYTES
    from salactl.runtime.ops.selection import num_windows

    heads, dense_len = config.num_attention_heads, config.sparse_config.dense_len
    worst = 0
    for phase in spec.phases:
        n, cached = spec.step_rows(phase)
        end = n + cached
        dense = max(0, min(end, dense_len - 1) - cached)
        selection = SELECTION_TEMPORARIES * 4 * heads * n * num_windows(end, config.sparse_config)
        if phase == "prefill":
            selection += ROW_GROUP_BYTES        # a decode row gathers only its kept blocks' tokens
        worst = max(worst, selection + SCORE_COPIES * 4 * heads * dense * end)
    return worst


def step_memory_bytes(spec: ProfileSpec, config, act_bytes: int, quantized: bool,
                      reference: bool = True) -> tuple[int, int]:
    """(caches and working memory, weights) in bytes: every profiled sequence (batch per phase)
    holds its context plus the new tokens in KV (sparse layers), their compressed keys (K1) and one
    fp32 state per lightning layer, and the reference backend its attention temporaries and the
    step's key compression; the weights are counted as loaded (full precision unless the checkpoint
    is quantized)."""
    from salactl.bench.grid_memory import cache_bytes_per_request
    from salactl.runtime.kv_fp8 import kv_item_bytes
    from salactl.reports.memory import weight_bytes

    kv_item = kv_item_bytes(spec.kv_cache_dtype, act_bytes)
    caches = sum(spec.batch * cache_bytes_per_request(config, sum(spec.step_rows(p)), kv_item, act_bytes)
                 for p in spec.phases)
    working = (spec.batch * reference_attention_bytes(spec, config) + compression_bytes(spec, config, act_bytes)
               if reference else 0)
    # weight_bytes' "bf16" is any unquantized model, at act_bytes a weight
    weights = weight_bytes(config, spec.weights if quantized else "bf16", act_bytes=act_bytes).total
    return caches + working, weights


def compression_bytes(spec: ProfileSpec, config, act_bytes: int) -> int:
    """The reference step's largest key-compression temporaries (runtime/cache.py compressed_keys,
    one layer of one sequence at a time): the fp32 copy of the keys of the windows it adds (the
    step's own tokens: the workload builds the context's K1 beforehand) and the layer's whole K1,
    which torch.cat copies while the old one is alive."""
    from salactl.runtime.ops.selection import num_windows

    sc, per_key = config.sparse_config, config.num_key_value_heads * config.head_dim
    worst = 0
    for phase in spec.phases:
        n, cached = spec.step_rows(phase)
        worst = max(worst, per_key * (4 * (n + sc.kernel_size) + act_bytes * num_windows(n + cached, sc)))
    return worst


def largest_fitting(fits, high: int) -> int:
    """The largest n in [1, high] with fits(n) (fits is monotone), 0 when none."""
    lo, hi = 0, high
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid - 1)
    return lo


def _fixes(spec: ProfileSpec, config, act_bytes: int, quantized: bool, reference: bool, avail: int) -> str:
    """What fits in `avail` bytes (by the same count as check_memory)."""
    return _advice(spec, lambda s: sum(step_memory_bytes(s, config, act_bytes, quantized, reference)) <= avail)


def _advice(spec: ProfileSpec, fits_spec) -> str:
    """The largest --context at this --batch, the largest --batch at this --context and, for a
    prefill step, the largest --chunk-size at both, for which fits_spec(spec) holds."""
    import dataclasses

    def fits(**change) -> bool:
        return fits_spec(dataclasses.replace(spec, **change))

    context = largest_fitting(lambda c: fits(context=c), spec.context)
    batch = largest_fitting(lambda b: fits(batch=b), spec.batch)
    chunk = (largest_fitting(lambda c: fits(chunk_size=c), spec.chunk_size)
             if "prefill" in spec.phases else 0)
    fixes = [f"--context (at most about {context:,} tokens at this --batch)" if context else None,
             f"--batch (at most {batch:,} at this --context)" if batch else None,
             f"--chunk-size (at most {chunk:,} at this --context and --batch)" if chunk else None]
    fixes = [f for f in fixes if f]
    if not fixes:
        return "the weights leave no room for the caches; use --weights w4a16 or a device with more memory"
    return "use a smaller " + " or a smaller ".join(fixes)


def check_memory(spec: ProfileSpec, config, device, act_bytes: int, quantized: bool) -> None:
    """Exit 11 when the reference backend's caches, working memory and weights need more than
    `device` has."""
    from salactl.runtime.loader import available_bytes

    avail = available_bytes(device)
    if avail is None:
        return
    caches, weights = step_memory_bytes(spec, config, act_bytes, quantized)
    if caches + weights <= avail:
        return
    raise CapacityError(
        f"--context {spec.context:,} x --batch {spec.batch:,} needs {human_bytes(caches)} for the caches "
        f"and working memory (+ {human_bytes(weights)} for the weights), but {device} has "
        f"{human_bytes(avail)} available; {_fixes(spec, config, act_bytes, quantized, True, avail)}")


def _engine_plan(spec: ProfileSpec, config, free_bytes: int, act_bytes: int):
    """GPUEngine's plan_pools over build_engine_workload's sizes (CapacityError where they cannot fit)."""
    from salactl.runtime.kv_fp8 import kv_item_bytes
    from salactl.profiling.engine_workload import engine_sizes
    from salactl.runtime.gpu.mem_fraction import DEFAULT_MEM_FRACTION
    from salactl.runtime.gpu.pools import plan_pools

    sizes = engine_sizes(spec, config)
    return plan_pools(config, free_bytes, DEFAULT_MEM_FRACTION, sizes["max_running_requests"], sizes["chunk_size"],
                      kv_itemsize=kv_item_bytes(spec.kv_cache_dtype, act_bytes),
                      act_itemsize=act_bytes, max_context=sizes["kv_tokens"], kv_tokens=sizes["kv_tokens"])


def check_engine_memory(spec: ProfileSpec, config, device, act_bytes: int, quantized: bool,
                        avail: int | None) -> None:
    """Exit 11, before loading, where the engine backend's pools (KV pages, GLA state slots, the
    prefill reserve, in the engine's share of the memory the weights leave free) cannot fit:
    GPUEngine's own check (plan_pools), restated in profile's flags."""
    if avail is None:
        return
    weights = step_memory_bytes(spec, config, act_bytes, quantized)[1]
    free = max(avail - weights, 0)

    def fits(s: ProfileSpec) -> bool:
        try:
            _engine_plan(s, config, free, act_bytes)
        except CapacityError:
            return False
        return True

    if fits(spec):
        return
    from salactl.runtime.gpu.mem_fraction import DEFAULT_MEM_FRACTION

    raise CapacityError(
        f"--context {spec.context:,} x --batch {spec.batch:,} does not fit the GPU engine's caches: its KV pages, "
        f"state slots and prefill working memory must fit in {DEFAULT_MEM_FRACTION:g} of what {device} has left "
        f"after the weights: {human_bytes(free)} ({human_bytes(avail)} available, {human_bytes(weights)} of "
        "weights); "
        f"{_advice(spec, fits)}")


def check_spec(spec: ProfileSpec) -> None:
    """Everything that can fail before the model loads, in the order loading would find it."""
    from salactl.runtime.loader import (check_host_memory, model_config, model_quantization, resolve_device,
                                        resolve_dtype)

    device = resolve_device(spec.device)
    config = model_config(spec.model, spec.random_weights)
    spec = spec.with_checkpoint_weights()          # a Python caller's weights="auto", as the CLI resolves it
    quantized = model_quantization(spec.model, spec.random_weights) is not None
    dtype = resolve_dtype(spec.dtype, device)
    check_layers(spec, config)
    engine = check_backend(spec, device)
    if not quantized:
        check_host_memory(config, dtype, device, spec.model)     # the weights alone, as loading would
    if engine:
        from salactl.runtime.loader import available_bytes

        check_engine_memory(spec, config, device, dtype.itemsize, quantized, available_bytes(device))
    else:
        check_memory(spec, config, device, dtype.itemsize, quantized)
    warn_long_context(spec, config)


def warn_long_context(spec: ProfileSpec, config) -> None:
    """run's warning where the profiled positions pass max_position_embeddings (a decode step's
    token sits at position --context, one past the cached ones)."""
    from salactl import output

    if "decode" in spec.phases:
        output.warn_past_trained_length(spec.context + 1, config.max_position_embeddings,
                                        "--context plus the decoded token")
    else:
        output.warn_past_trained_length(spec.context, config.max_position_embeddings, "--context")

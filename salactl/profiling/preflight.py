"""Checks of a ProfileSpec against the model and the machine before anything is loaded or
allocated: the device, dtype, model, --layers, --backend, and the memory the step's caches need
(a --context or --batch too large fails here with exit 11, not in an allocator)."""

from __future__ import annotations

from salactl.errors import CapacityError, UsageError
from salactl.output import human_bytes
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
        raise UsageError("--backend engine needs a CUDA GPU and triton (pip install 'salactl[gpu]'); "
                         "use --backend reference")
    return spec.backend != "reference" and usable


def _kv_bytes_per_token(spec: ProfileSpec, config, act_bytes: int) -> int:
    from salactl.reports.memory import kv_bytes_per_token

    kv_dtype = "fp8" if spec.kv_cache_dtype.startswith("fp8") else {2: "bfloat16", 4: "float32"}[act_bytes]
    return kv_bytes_per_token(config, kv_dtype)


def step_memory_bytes(spec: ProfileSpec, config, act_bytes: int) -> tuple[int, int]:
    """(caches, weights) in bytes: every profiled sequence (batch per phase) holds its context plus
    the new tokens in KV (sparse layers) and one fp32 state per lightning layer; the weights are
    counted as loaded (full precision unless the checkpoint is quantized)."""
    from salactl.reports.memory import gla_state_bytes, weight_bytes

    per_token = _kv_bytes_per_token(spec, config, act_bytes)
    caches = sum(spec.batch * (sum(spec.step_rows(p)) * per_token + gla_state_bytes(config))
                 for p in spec.phases)
    quantized = dict(config.extra).get("quantization_config") is not None
    weights = weight_bytes(config, spec.weights if quantized else "bf16", act_bytes=act_bytes).total
    return caches, weights


def _fixes(spec: ProfileSpec, config, act_bytes: int, room: int) -> str:
    """What fits in `room` bytes: the largest --context at this --batch, the largest --batch at
    this --context."""
    from salactl.reports.memory import gla_state_bytes

    per_token = _kv_bytes_per_token(spec, config, act_bytes)
    per_sequence = max(sum(spec.step_rows(p)) for p in spec.phases) * per_token + gla_state_bytes(config)
    sequences = spec.batch * len(spec.phases)
    context = max(0, (room // sequences - gla_state_bytes(config)) // per_token - 1)
    batch = max(0, room // len(spec.phases) // per_sequence)
    fixes = [f"--context (at most about {context:,} tokens at this --batch)" if context else None,
             f"--batch (at most {batch:,} at this --context)" if batch else None]
    fixes = [f for f in fixes if f]
    if not fixes:
        return "the weights leave no room for the caches; use --weights w4a16 or a device with more memory"
    return "use a smaller " + " or a smaller ".join(fixes)


def check_memory(spec: ProfileSpec, config, device, act_bytes: int) -> None:
    """Exit 11 when the caches and weights need more than `device` has available."""
    from salactl.runtime.loader import available_bytes

    avail = available_bytes(device)
    if avail is None:
        return
    caches, weights = step_memory_bytes(spec, config, act_bytes)
    if caches + weights <= avail:
        return
    raise CapacityError(
        f"--context {spec.context:,} x --batch {spec.batch:,} needs {human_bytes(caches)} for the caches "
        f"(+ {human_bytes(weights)} for the weights), but {device} has {human_bytes(avail)} available; "
        f"{_fixes(spec, config, act_bytes, max(0, avail - weights))}")


def check_spec(spec: ProfileSpec) -> None:
    """Everything that can fail before the model loads, in the order loading would find it."""
    from salactl.runtime.loader import check_host_memory, model_config, resolve_device, resolve_dtype

    device = resolve_device(spec.device)
    config = model_config(spec.model, spec.random_weights)
    dtype = resolve_dtype(spec.dtype, device)
    check_layers(spec, config)
    check_backend(spec, device)
    if dict(config.extra).get("quantization_config") is None:
        check_host_memory(config, dtype, device, spec.model)     # the weights alone, as loading would
    check_memory(spec, config, device, dtype.itemsize)

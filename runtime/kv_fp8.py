"""FP8 KV cache: dtype names, fp32 scales, quantize on write / dequantize on read
(reference/quantization.md §4). Shared by the reference cache and the GPU engine.

- Stored value: fp8(x / scale), saturated to the format's finite range (round to nearest).
- Scales: fp32 per sparse layer, shape [num_kv_heads] (a per-layer scalar is broadcast), calibrated
  by `salactl quantize --kv-cache-dtype fp8_e4m3` as amax(|K|) / finfo.max over calibration tokens
  and stored as `model.layers.N.self_attn.{k,v}_scale`.
- Policy without calibrated scales: fp8_e5m2 uses 1.0 (its range, ±57344, covers activations);
  fp8_e4m3 (±448) is refused, because unscaled e4m3 silently clips large keys/values.
- Scales calibrated for the other FP8 dtype (quantization_config.meta.kv_cache_dtype) are rescaled
  to the one run, keeping the amax they encode, with a warning.
"""

from __future__ import annotations

import torch

from salactl.errors import CheckpointError, ConfigError, UsageError

KV_CACHE_DTYPES: dict[str, torch.dtype | None] = {
    "auto": None, "bf16": None, "fp8_e4m3": torch.float8_e4m3fn, "fp8_e5m2": torch.float8_e5m2,
}
SGLANG_DTYPE_NAMES = {"fp8_e4m3": "float8_e4m3fn", "fp8_e5m2": "float8_e5m2"}
# the only dtype SGLang's --quantization-param-path schema accepts (KVCacheQuantSchema.check_is_fp8)
SGLANG_KV_DTYPE = "float8_e4m3fn"
SGLANG_E5M2_WARNING = ("warning: kv_cache_scales.json not written: SGLang's --quantization-param-path file "
                       "supports only fp8_e4m3 (float8_e4m3fn); SGLang runs fp8_e5m2 with scale 1.0")

KVScales = dict[int, tuple[torch.Tensor, torch.Tensor]]


def fp8_dtype(name: str) -> torch.dtype | None:
    """The storage dtype for a --kv-cache-dtype name (None = the activation dtype)."""
    try:
        return KV_CACHE_DTYPES[name]
    except KeyError:
        raise UsageError(f"kv_cache_dtype (--kv-cache-dtype) {name!r} is unknown; "
                         f"valid: {', '.join(KV_CACHE_DTYPES)}") from None


def stored_kv_name(name: str, act_dtype: torch.dtype) -> str:
    """What a --kv-cache-dtype stores, for records: the FP8 name, else the activation dtype's
    ("bf16"/"auto" on a float32 model store float32)."""
    return name if fp8_dtype(name) else str(act_dtype).replace("torch.", "")


def kv_item_bytes(name: str, act_itemsize: int) -> int:
    """Bytes of one stored key (or value) element for a --kv-cache-dtype: 1 for FP8, else the
    activation dtype's `act_itemsize` ("bf16"/"auto" on a float32 model store float32)."""
    return 1 if fp8_dtype(name) else act_itemsize


def fp8_max(dtype: torch.dtype) -> float:
    return float(torch.finfo(dtype).max)


def quantize_kv(x: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """x [n, Hkv, d]; scale [Hkv] fp32 -> fp8 [n, Hkv, d] = saturate(x / scale)."""
    m = fp8_max(dtype)
    return (x.float() / scale[:, None]).clamp_(-m, m).to(dtype)


def dequantize_kv(x8: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return (x8.float() * scale[:, None]).to(dtype)


def model_kv_scales(model) -> KVScales:
    """Calibrated scales attached to a loaded model (self_attn.k_scale / v_scale buffers)."""
    out: KVScales = {}
    for i, layer in enumerate(model.model.layers):
        attn = layer.self_attn
        k, v = getattr(attn, "k_scale", None), getattr(attn, "v_scale", None)
        if k is not None and v is not None:
            out[i] = (k, v)
    return out


def _per_head(t: torch.Tensor, heads: int, device) -> torch.Tensor:
    flat = t.detach().to(device=device, dtype=torch.float32).reshape(-1)
    if flat.numel() not in (1, heads) or not bool(torch.isfinite(flat).all()) or bool((flat <= 0).any()):
        raise ConfigError(f"a KV scale must be a positive finite scalar or one per KV head ({heads}), "
                          f"got shape {list(t.shape)} with values {flat[:heads].tolist()}")
    return flat.expand(heads).contiguous()


def resolve_kv_scales(config, kv_cache_dtype: str, calibrated: KVScales | None, device) -> KVScales | None:
    """Per sparse layer (k_scale [Hkv], v_scale [Hkv]) for an fp8 cache; None for bf16/auto."""
    dt = fp8_dtype(kv_cache_dtype)
    if dt is None:
        return None
    calibrated = calibrated or {}
    hkv = config.num_key_value_heads
    missing = [i for i in config.sparse_layers if i not in calibrated]
    if missing and dt == torch.float8_e4m3fn:
        raise _no_scales_error(missing[0])
    one = torch.ones(hkv, device=device, dtype=torch.float32)
    f = _recalibration(config, kv_cache_dtype) if calibrated else 1.0
    return {i: ((_per_head(calibrated[i][0], hkv, device) * f, _per_head(calibrated[i][1], hkv, device) * f)
                if i in calibrated else (one, one)) for i in config.sparse_layers}


def _no_scales_error(layer: int) -> ConfigError:
    return ConfigError(
        f"--kv-cache-dtype fp8_e4m3 needs calibrated k/v scales, but layer {layer} has none; "
        "quantize with `salactl quantize --kv-cache-dtype fp8_e4m3` or use fp8_e5m2 (scale 1.0)")


def check_scales_before_loading(config, directory, random_weights: bool, kv_cache_dtype: str) -> None:
    """resolve_kv_scales' refusal of fp8_e4m3 without calibrated scales, from the checkpoint's
    tensor names alone (random weights have none): a run it refuses loads no weights. A layer with
    only one of the pair is the loader's CheckpointError (attach_kv_scales), as other dtypes get it."""
    if fp8_dtype(kv_cache_dtype) != torch.float8_e4m3fn:
        return
    from salactl.quant.loading import kv_scale_sources
    from salactl.runtime.checkpoint import tensor_files

    names = {} if random_weights or directory is None else tensor_files(directory)
    have = kv_scale_sources(config, names)
    for i in config.sparse_layers:
        if ((i, "k_scale") in have) != ((i, "v_scale") in have):
            raise CheckpointError(f"layer {i} has only one of self_attn.k_scale / v_scale")
    missing = [i for i in config.sparse_layers if (i, "k_scale") not in have]
    if missing:
        raise _no_scales_error(missing[0])


def calibrated_kv_dtype(config) -> str | None:
    """The FP8 dtype a checkpoint's k/v scales were calibrated for, as `salactl quantize` records it
    (quantization_config.meta.kv_cache_dtype, torch's names such as float8_e4m3fn taken too); None
    where the checkpoint does not say or names no FP8 dtype (then with a warning)."""
    qc = dict(config.extra).get("quantization_config")
    meta = qc.get("meta") if isinstance(qc, dict) else None
    name = meta.get("kv_cache_dtype") if isinstance(meta, dict) else None
    if name is None or name in SGLANG_DTYPE_NAMES:
        return name
    by_torch_name = {v: k for k, v in SGLANG_DTYPE_NAMES.items()}
    if name in by_torch_name:
        return by_torch_name[name]
    from salactl.output import warn_once        # here: rich, which it imports, draws from `random`

    warn_once(f"quantization_config.meta.kv_cache_dtype {name!r} names no FP8 dtype (fp8_e4m3, fp8_e5m2); "
                     "its KV scales are used as they are")
    return None


def _recalibration(config, kv_cache_dtype: str) -> float:
    """What turns scales calibrated for another FP8 dtype into `kv_cache_dtype`'s: scale = amax /
    fp8_max, so fp8_max(calibrated) / fp8_max(run) keeps the amax they encode (used unchanged,
    e5m2's amax/57344 would make e4m3 saturate everything above amax/128)."""
    calibrated = calibrated_kv_dtype(config)
    # Unlabelled scales (other tools'; vLLM and SGLang store e4m3 ones) are assumed calibrated for
    # the dtype run and used as they are: exact for fp8_e4m3; under fp8_e5m2, e4m3 scales keep
    # values within +-448, far inside e5m2's range.
    if calibrated is None or calibrated == kv_cache_dtype:
        return 1.0
    m_cal, m_run = fp8_max(fp8_dtype(calibrated)), fp8_max(fp8_dtype(kv_cache_dtype))
    from salactl.output import warn_once

    warn_once(f"the checkpoint's KV scales were calibrated for {calibrated}, not {kv_cache_dtype}: "
                     f"they run multiplied by {m_cal / m_run:g} ({m_cal:g} / {m_run:g}, the two formats' "
                     "largest values), which keeps their calibrated range")
    return m_cal / m_run


def scales_from_amax(amax: KVScales, dtype_name: str, per_head: bool) -> KVScales:
    """amax(|K|), amax(|V|) per layer (per head) -> scales amax / finfo.max (1.0 where amax is 0)."""
    m = fp8_max(fp8_dtype(dtype_name))
    out: KVScales = {}
    for layer, (ka, va) in amax.items():
        pair = []
        for a in (ka, va):
            a = a.float() if per_head else a.float().amax().reshape(())
            pair.append(torch.where(a > 0, a / m, torch.ones_like(a)))
        out[layer] = (pair[0], pair[1])
    return out


def sglang_scales_json(scales: KVScales, dtype_name: str, config) -> dict | None:
    """SGLang's --quantization-param-path file (its QuantParamSchema), TP rank "0": one per-tensor
    factor per layer; a per-head scale is exported as its maximum, and k/v share max(k_scale, v_scale).
    SGLang validates it strictly and, on any error, silently runs with 1.0 everywhere:
    - `model_type` is required and must equal the config's model_type;
    - every rank lists exactly num_hidden_layers indices 0..L-1 (1.0 for the lightning layers,
      which have no KV cache);
    - `dtype` must be float8_e4m3fn: None for fp8_e5m2, which the file cannot hold."""
    if SGLANG_DTYPE_NAMES[dtype_name] != SGLANG_KV_DTYPE:
        return None
    if sorted(scales) != sorted(config.sparse_layers):
        raise ConfigError(f"KV scales cover layers {sorted(scales)}, but the softmax attention layers are "
                          f"{list(config.sparse_layers)}")
    per_layer = {str(i): float(torch.maximum(scales[i][0].max(), scales[i][1].max())) if i in scales else 1.0
                 for i in range(config.num_hidden_layers)}
    return {"model_type": config.to_hf_dict()["model_type"],
            "kv_cache": {"dtype": SGLANG_KV_DTYPE, "scaling_factor": {"0": per_layer}}}

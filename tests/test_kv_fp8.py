import pytest
import torch

from conftest import rel_err, tiny_config, tiny_model
from salactl.errors import ConfigError, UsageError
from salactl.runtime.cache import SequenceCache
from salactl.runtime.engine import Engine
from salactl.runtime.kv_fp8 import (dequantize_kv, quantize_kv, resolve_kv_scales, scales_from_amax,
                                    sglang_scales_json)


@pytest.mark.parametrize("dtype,mant", [(torch.float8_e4m3fn, 3), (torch.float8_e5m2, 2)])
def test_fp8_round_trip_error_bound_and_saturation(dtype, mant, rng):
    x = torch.randn(64, 2, 32, generator=rng) * torch.tensor([1.0, 20.0])[None, :, None]
    scale = x.abs().amax(dim=(0, 2)) / torch.finfo(dtype).max            # per KV head
    y = dequantize_kv(quantize_kv(x, scale, dtype), scale, torch.float32)
    normal = x.abs() >= scale[None, :, None] * torch.finfo(dtype).tiny
    # round to nearest: relative error at most half an ulp, 2^-(mantissa+1)
    assert bool(((y - x).abs() <= x.abs() * 2.0 ** -(mant + 1) + 1e-12)[normal].all())
    assert bool(((y - x).abs() <= scale[None, :, None] * torch.finfo(dtype).tiny)[~normal].all())
    big = quantize_kv(torch.full((1, 2, 1), 1e9), scale, dtype)            # saturates, never inf/nan
    assert bool(torch.isfinite(big.float()).all())
    assert torch.equal(big.float(), torch.full((1, 2, 1), torch.finfo(dtype).max))


def test_fp8_cache_halves_kv_bytes_and_dequantizes_what_it_stores(rng):
    cfg = tiny_config()
    scales = {i: (torch.full((2,), 0.01), torch.full((2,), 0.02)) for i in cfg.sparse_layers}
    fp8 = SequenceCache(cfg, "cpu", torch.bfloat16, capacity=4, kv_cache_dtype="fp8_e4m3", kv_scales=scales)
    ref = SequenceCache(cfg, "cpu", torch.bfloat16, capacity=4)
    k = torch.randn(10, 2, cfg.head_dim, generator=rng).bfloat16()
    v = torch.randn(10, 2, cfg.head_dim, generator=rng).bfloat16()
    layer = cfg.sparse_layers[0]
    k8, v8 = fp8.append_kv(layer, k, v)          # grows past the capacity of 4
    ref.append_kv(layer, k, v)
    fp8.length = ref.length = 10
    assert k8.dtype == v8.dtype == torch.float8_e4m3fn and k8.shape == k.shape
    kk, vv = fp8.dequantized(layer, k8, v8)
    assert kk.dtype == torch.bfloat16 and kk.shape == k.shape
    assert rel_err(kk.float(), k.float()) < 0.05 and rel_err(vv.float(), v.float()) < 0.05
    assert fp8.kv_bytes() * 2 == ref.kv_bytes()


def _calibrated_scales(model, cfg, prompt):
    from salactl.quant.sequential import _KVAmaxBackend

    backend = _KVAmaxBackend(cfg, torch.device("cpu"))
    eng = Engine(model, "cpu", backend=backend)
    eng.prefill(eng.new_sequence(), prompt)
    return scales_from_amax(backend.amax, "fp8_e4m3", per_head=False)


def test_fp8_kv_logits_stay_close_to_bf16_kv(rng):
    cfg = tiny_config()
    model = tiny_model(cfg, dtype=torch.bfloat16)
    prompt = torch.randint(0, cfg.vocab_size, (320,), generator=rng).tolist()   # dense and sparse queries
    for i, (k, v) in _calibrated_scales(model, cfg, prompt[:128]).items():
        model.model.layers[i].self_attn.register_buffer("k_scale", k)
        model.model.layers[i].self_attn.register_buffer("v_scale", v)
    runs = {}
    for kv in ("bf16", "fp8_e4m3", "fp8_e5m2"):
        eng = Engine(model, "cpu", chunk_size=100, kv_cache_dtype=kv)
        runs[kv] = eng.prefill(eng.new_sequence(), prompt, all_logits=True)
    # a random 8-layer model amplifies rounding: bf16 weights alone move its logits ~3% from fp32
    e4, e5 = rel_err(runs["fp8_e4m3"], runs["bf16"]), rel_err(runs["fp8_e5m2"], runs["bf16"])
    assert 0 < e4 < 0.08 and e5 < 0.15
    assert e4 < e5                              # 3 mantissa bits beat 2 once the range is calibrated


def test_e4m3_without_scales_is_refused_and_e5m2_defaults_to_one():
    cfg = tiny_config()
    model = tiny_model(cfg)
    with pytest.raises(ConfigError, match="fp8_e4m3 needs calibrated"):
        Engine(model, "cpu", kv_cache_dtype="fp8_e4m3")
    scales = resolve_kv_scales(cfg, "fp8_e5m2", None, "cpu")
    assert set(scales) == set(cfg.sparse_layers) and all(bool((k == 1).all()) for k, _ in scales.values())
    assert resolve_kv_scales(cfg, "bf16", None, "cpu") is None
    with pytest.raises(UsageError, match="fp8_e4m3"):
        resolve_kv_scales(cfg, "int8", None, "cpu")
    with pytest.raises(ConfigError, match="per KV head"):
        resolve_kv_scales(cfg, "fp8_e4m3", {i: (torch.ones(3), torch.ones(3)) for i in cfg.sparse_layers}, "cpu")


def test_sglang_quantization_param_json():
    cfg = tiny_config()                                   # 8 layers, softmax attention at 0 and 7
    scales = {0: (torch.tensor([0.5, 0.25]), torch.tensor([0.75, 0.1])), 7: (torch.tensor(0.2), torch.tensor(0.1))}
    want = {"model_type": "minicpm_sala",                 # required by SGLang's schema
            "kv_cache": {"dtype": "float8_e4m3fn", "scaling_factor": {"0": {
                "0": 0.75, **{str(i): 1.0 for i in range(1, 7)}, "7": pytest.approx(0.2)}}}}   # every layer
    assert sglang_scales_json(scales, "fp8_e4m3", cfg) == want
    assert sglang_scales_json(scales, "fp8_e5m2", cfg) is None          # SGLang's file is e4m3 only
    with pytest.raises(ConfigError, match="softmax attention layers are"):
        sglang_scales_json({0: scales[0]}, "fp8_e4m3", cfg)             # a calibrated layer missing

"""Calibrated FP8 KV scales as the runtime uses them: a checkpoint with one scale per KV head runs
with each head's own scale (not the layer's largest), stores fp8(x / scale_h); a zero amax
calibrates to scale 1; a zero scale is refused."""

import pytest
import torch

from conftest import tiny_config
from salactl.errors import ConfigError
from salactl.runtime.checkpoint import random_state_dict
from salactl.runtime.checkpoint_write import save_checkpoint
from salactl.runtime.engine import Engine
from salactl.runtime.kv_fp8 import resolve_kv_scales, scales_from_amax
from salactl.runtime.loader import load_model

E4 = torch.float8_e4m3fn


@pytest.fixture(scope="module")
def per_head_checkpoint(tmp_path_factory):
    """tiny_config's random weights with per-KV-head k/v scales that differ per head and layer."""
    cfg = tiny_config()
    assert cfg.num_key_value_heads == 2
    state = random_state_dict(cfg, "cpu", torch.float32, 0)
    scales = {}
    for n, i in enumerate(cfg.sparse_layers):
        k, v = torch.tensor([0.01, 0.04]) * (n + 1), torch.tensor([0.03, 0.005]) * (n + 1)
        state[f"model.layers.{i}.self_attn.k_scale"], state[f"model.layers.{i}.self_attn.v_scale"] = k, v
        scales[i] = (k, v)
    path = save_checkpoint(state, cfg.to_hf_dict(), tmp_path_factory.mktemp("kv") / "ckpt")
    return path, scales


def test_per_head_scales_of_a_checkpoint_are_used_per_head(per_head_checkpoint, rng):
    path, stored = per_head_checkpoint
    lm = load_model(path, "cpu", "float32")
    eng = Engine(lm.model, "cpu", kv_cache_dtype="fp8_e4m3")
    assert sorted(eng.kv_scales) == sorted(stored)
    for i, (k, v) in stored.items():
        torch.testing.assert_close(eng.kv_scales[i][0], k, rtol=0, atol=0)
        torch.testing.assert_close(eng.kv_scales[i][1], v, rtol=0, atol=0)

    seq = eng.new_sequence()
    layer = lm.config.sparse_layers[1]
    ks, vs = stored[layer]
    x = torch.randn(6, 2, lm.config.head_dim, generator=rng)
    k8, v8 = seq.append_kv(layer, x, 2 * x)
    assert seq.scales(layer) is eng.kv_scales[layer]
    top = torch.finfo(E4).max   # saturated: how torch casts past the range differs between versions
    for h in range(2):          # what each head stores: fp8(x / its own scale)
        assert torch.equal(k8[:, h].float(), (x[:, h] / ks[h]).clamp(-top, top).to(E4).float())
        assert torch.equal(v8[:, h].float(), (2 * x[:, h] / vs[h]).clamp(-top, top).to(E4).float())
    kk, _ = seq.dequantized(layer, k8, v8)
    assert torch.equal(kk, k8.float() * ks[None, :, None])


def test_a_zero_amax_calibrates_to_scale_one():
    amax = {0: (torch.tensor([0.0, 448.0 * 3]), torch.tensor([0.0, 0.0]))}
    (k, v), = scales_from_amax(amax, "fp8_e4m3", per_head=True).values()
    assert k.tolist() == [1.0, 3.0] and v.tolist() == [1.0, 1.0]
    (k, v), = scales_from_amax(amax, "fp8_e4m3", per_head=False).values()
    assert float(k) == 3.0 and float(v) == 1.0        # a layer that never saw a value: 1, not 0/448 = 0


@pytest.mark.parametrize("bad", [torch.tensor([0.0, 0.1]), torch.tensor(0.0), torch.tensor([-0.1, 0.1])])
def test_a_zero_or_negative_calibrated_scale_is_refused(bad):
    cfg = tiny_config()
    good = torch.tensor([0.1, 0.1])
    calibrated = {i: (good, good) for i in cfg.sparse_layers}
    calibrated[cfg.sparse_layers[0]] = (good, bad)
    with pytest.raises(ConfigError, match="a KV scale must be a positive finite scalar or one per KV head"):
        resolve_kv_scales(cfg, "fp8_e4m3", calibrated, "cpu")

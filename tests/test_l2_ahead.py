"""The decode projections' L2 prefetch (runtime/ops/l2_ahead.py): its knob, that it does nothing
off the GPU, and on the GPU that the engine's tokens are the same with it as without it."""

import pytest
import torch

from conftest import gpu

triton = pytest.importorskip("triton")

from salactl.runtime.ops import l2_ahead  # noqa: E402


def test_fractions_parse_clamp_and_reject(monkeypatch):
    monkeypatch.delenv("SALACTL_L2_AHEAD", raising=False)
    assert l2_ahead.fractions() == {}
    monkeypatch.setenv("SALACTL_L2_AHEAD", "o=1+gu=0.125,qkv=2,down=0")
    assert l2_ahead.fractions() == {"o": 1.0, "gu": 0.125, "qkv": 1.0}
    monkeypatch.setenv("SALACTL_L2_AHEAD", "0")
    assert l2_ahead.fractions() == {}
    monkeypatch.setenv("SALACTL_L2_AHEAD", "mlp=1")
    with pytest.raises(ValueError, match="SALACTL_L2_AHEAD: bad entry 'mlp=1'"):
        l2_ahead.fractions()


def test_ahead_is_a_no_op_off_the_gpu(monkeypatch):
    """CPU modules and plain Linear layers: no side stream is created, nothing to join."""
    from salactl.profiling.weights import quantize_rtn_in_memory
    from conftest import tiny_config, tiny_model

    monkeypatch.setenv("SALACTL_L2_AHEAD", "o=1,gu=1,qkv=1,down=1")
    cfg = tiny_config()
    model = quantize_rtn_in_memory(tiny_model(cfg), cfg)
    layer = model.model.layers[0]
    for module in (layer.mlp.down_proj, torch.nn.Linear(8, 8)):
        l2_ahead.ahead(module, "down", 1, torch.device("cpu"))
    l2_ahead.join(torch.device("cpu"))
    assert not l2_ahead._SIDE and not l2_ahead._FORKED


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("numel", [4096, 16 << 10, 3 * (64 << 10) + 48])
def test_prefetch_leaves_data_unchanged(numel):
    t = torch.randint(-2 ** 31, 2 ** 31 - 1, (numel,), dtype=torch.int32, device="cuda")
    before = t.clone()
    for chunks, frac in ((1, 1.0), (4, 0.3), (8, 0.01)):
        l2_ahead.prefetch_chunks(t, chunks, frac)
    torch.cuda.synchronize()
    assert torch.equal(t, before)


@pytest.mark.gpu
@gpu
def test_w4a16_engine_tokens_equal_with_prefetch(monkeypatch):
    """Greedy tokens of a W4A16 sala-nano model through the GPU engine (CUDA graphs: the fork and
    join are captured) with every prefetch on equal those without it."""
    from salactl.profiling.weights import quantize_rtn_in_memory
    from salactl.runtime.checkpoint import random_state_dict
    from salactl.runtime.gpu.engine import GPUEngine
    from salactl.runtime.loader import build_model
    from salactl.runtime.presets import sala_nano
    from salactl.runtime.sampling import SamplingParams

    cfg = sala_nano(vocab_size=512)
    model = quantize_rtn_in_memory(build_model(cfg, random_state_dict(cfg, "cuda", torch.bfloat16, 3)), cfg)
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, 512, (n,), generator=g).tolist() for n in (7, 300)]
    params = SamplingParams(max_new_tokens=8, ignore_eos=True)
    out = {}
    for setting in ("0", "o=1,gu=0.5,qkv=0.5,down=0.25"):
        monkeypatch.setenv("SALACTL_L2_AHEAD", setting)
        engine = GPUEngine(model, "cuda", max_running_requests=2, chunk_size=128, kv_tokens=4096)
        out[setting] = [r.output_token_ids for r in engine.generate([(p, params) for p in prompts])]
        del engine
    assert l2_ahead._SIDE, "the prefetch never ran"
    assert out["0"] == out["o=1,gu=0.5,qkv=0.5,down=0.25"]

import pytest
import torch

from salactl.errors import QuantizationError
from salactl.quant.gptq import Hessian, gptq_quantize, prepare_hessian
from salactl.quant.quantizer import QuantSpec, output_error
from salactl.quant.rtn import rtn_quantize


def _correlated_inputs(rng, tokens=2048, k=256):
    mix = torch.randn(k, k, generator=rng) / k ** 0.5
    x = torch.randn(tokens, k, generator=rng) @ mix + 0.05 * torch.randn(tokens, k, generator=rng)
    return x * torch.linspace(0.2, 3.0, k)           # uneven channel scales, like real activations


def _hessian(x, chunks=3):
    h = Hessian(x.shape[1], "cpu")
    for part in x.chunk(chunks):
        h.add(part)
    return h


def test_hessian_is_the_running_mean_of_2xxT(rng):
    x = torch.randn(300, 16, generator=rng)
    h = _hessian(x, chunks=4)
    assert h.n == 300
    assert torch.allclose(h.h, 2 * x.t() @ x / 300, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("bits,group", [(4, 128), (4, 32), (4, -1), (8, 64)])
@pytest.mark.parametrize("act_order", [False, True])
def test_gptq_objective_below_rtn(bits, group, act_order, rng):
    x = _correlated_inputs(rng)
    w = torch.randn(96, 256, generator=rng) * 0.05
    h = _hessian(x)
    spec = QuantSpec(bits, group)
    q = gptq_quantize(w, prepare_hessian(h.h, 0.01, act_order, "t"), spec)
    r = rtn_quantize(w, spec)
    direct = lambda d: float(((w - d) @ x.t()).norm() / (w @ x.t()).norm())  # noqa: E731
    assert output_error(w, q.dequantized, h.h) == pytest.approx(direct(q.dequantized), rel=1e-3)
    assert direct(q.dequantized) < 0.9 * direct(r.dequantized)
    # the codes, scales and g_idx reproduce the dequantized weight exactly (what the loader computes)
    g = q.g_idx.long()
    rebuilt = q.scales.float()[g].t() * (q.codes.float() - spec.zero)
    assert torch.equal(rebuilt, q.dequantized)
    assert int(q.codes.max()) <= spec.maxq


def test_act_order_static_groups_keep_g_idx_monotone(rng):
    x = _correlated_inputs(rng)
    w = torch.randn(64, 256, generator=rng) * 0.05
    prep = prepare_hessian(_hessian(x).h, 0.01, True, "t")
    assert prep.perm is not None and not torch.equal(prep.perm, torch.arange(256))
    q = gptq_quantize(w, prep, QuantSpec(4, 64))
    assert torch.equal(q.g_idx, torch.arange(256, dtype=torch.int32) // 64)
    # static groups: each group's scales come from the original (un-updated) columns
    assert torch.equal(q.scales, rtn_quantize(w, QuantSpec(4, 64)).scales)


def test_dead_columns_are_zeroed(rng):
    x = _correlated_inputs(rng, k=128)
    x[:, 5] = 0
    w = torch.randn(64, 128, generator=rng)
    prep = prepare_hessian(_hessian(x).h, 0.01, False, "t")
    assert bool(prep.dead[5]) and int(prep.dead.sum()) == 1
    q = gptq_quantize(w, prep, QuantSpec(4, 128))
    assert bool((q.dequantized[:, 5] == 0).all())


def test_damping_is_raised_until_cholesky_succeeds():
    # a negative-definite direction: needs more than 1% of mean(diag) to become positive definite
    h = torch.eye(64) * 1.0
    h[0, 1] = h[1, 0] = 1.03
    prep = prepare_hessian(h, 0.01, False, "t")
    assert prep.damp > 0.01
    assert torch.isfinite(prep.u).all()


def test_nan_hessian_is_a_one_line_error():
    h = torch.eye(8)
    h[2, 3] = float("nan")
    with pytest.raises(QuantizationError, match="NaN") as e:
        prepare_hessian(h, 0.01, False, "model.layers.0.mlp.down_proj")
    assert "\n" not in str(e.value) and "down_proj" in str(e.value)


def test_bad_spec_is_rejected():
    with pytest.raises(QuantizationError, match="bits \\(--bits\\) 3"):
        QuantSpec(3, 128)
    with pytest.raises(QuantizationError, match="group_size \\(--group-size\\) 48"):
        QuantSpec(4, 48)


@pytest.mark.parametrize("K,group", [(100, 32), (200, 64), (96, 64)])
def test_lazy_blocks_are_exact_when_a_group_straddles_one(K, group, rng):
    """Lazy batching only reorders GPTQ's updates: a group running past a lazy block's end must
    see the block's updated columns, so any blocksize gives the one-block result."""
    x = _correlated_inputs(rng, tokens=1024, k=K)
    w = torch.randn(48, K, generator=rng)
    prep = prepare_hessian(_hessian(x).h, 0.01, False, "w")
    whole = gptq_quantize(w.clone(), prep, QuantSpec(4, group), blocksize=K)
    for blocksize in (16, 40, 64):
        lazy = gptq_quantize(w.clone(), prep, QuantSpec(4, group), blocksize=blocksize)
        assert torch.equal(lazy.scales, whole.scales), blocksize
        assert (lazy.codes != whole.codes).float().mean() < 1e-3, blocksize   # fp32 update order


def test_non_finite_output_error_is_nan_not_zero():
    h = torch.eye(4)
    w = torch.ones(2, 4)
    bad = w.clone()
    bad[0, 1] = float("nan")
    assert output_error(w, w, h) == 0.0
    assert output_error(bad, w, h) != output_error(bad, w, h)          # NaN

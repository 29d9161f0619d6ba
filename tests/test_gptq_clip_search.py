"""GPTQ's clip search: each group's scale is the min-max one or a shrunk one, whichever gives the least
Hessian-diagonal-weighted error; it never does worse than min-max on that error and the checkpoint's
codes and scales still rebuild the solver's weights exactly."""

import pytest
import torch

from salactl.quant.gptq import Hessian, gptq_quantize, prepare_hessian
from salactl.quant.quantizer import (CLIP_SHRINKS, QuantSpec, clipped_group_scale, dequantize_codes, group_scale,
                                     quantize_column)


def _weighted_error(w, scale, spec, cw):
    d = w - dequantize_codes(quantize_column(w, scale[:, None], spec), scale[:, None], spec)
    return (d * d * cw).sum(1)


@pytest.mark.parametrize("bf16_exact", [False, True])
def test_clipped_scale_is_the_best_candidate_per_row(bf16_exact, rng):
    spec = QuantSpec(4, 128, bf16_exact_scales=bf16_exact)
    w = torch.randn(64, 128, generator=rng) * 0.02
    w[::3, 7] *= 8                                   # outliers in a column that is rarely large
    cw = torch.rand(128, generator=rng) + 0.1
    cw[7] = 1e-3
    got = clipped_group_scale(w, spec, cw)
    candidates = torch.stack([group_scale(w, spec)] + [group_scale(w * p, spec) for p in CLIP_SHRINKS])
    errors = torch.stack([_weighted_error(w, s, spec, cw) for s in candidates])
    best = errors.min(0).values
    assert torch.equal(_weighted_error(w, got, spec, cw), best)
    assert bool((got[:, None] == candidates.t()).any(1).all())          # one of the stored-dtype candidates
    assert bool((best <= errors[0]).all()) and bool((best[::3] < errors[0][::3]).all())
    assert bool((got[::3] < group_scale(w, spec)[::3]).all())           # the outlier rows were clipped


def test_no_gain_keeps_min_max(rng):
    spec = QuantSpec(4, 32)
    w = torch.randn(8, 32, generator=rng)
    assert torch.equal(clipped_group_scale(w, spec, torch.zeros(32)), group_scale(w, spec))


def _problem(rng, k=256):
    mix = torch.randn(k, k, generator=rng) / k ** 0.5
    x = (torch.randn(2048, k, generator=rng) @ mix) * torch.linspace(0.2, 3.0, k)
    h = Hessian(k, "cpu")
    h.add(x)
    w = torch.randn(96, k, generator=rng) * 0.05
    w[::5, ::17] *= 6
    return w, x, h


@pytest.mark.parametrize("act_order", [False, True])
def test_gptq_with_clip_search_rebuilds_exactly_and_lowers_the_output_error(act_order, rng):
    w, x, h = _problem(rng)
    spec = QuantSpec(4, 64)
    prep = prepare_hessian(h.h, 0.01, act_order, "t")
    plain = gptq_quantize(w, prep, spec)
    clipped = gptq_quantize(w, prep, spec, clip_search=True)
    assert not torch.equal(clipped.scales, plain.scales)
    g = clipped.g_idx.long()
    assert torch.equal(clipped.scales.float()[g].t() * (clipped.codes.float() - spec.zero), clipped.dequantized)
    err = lambda q: float(((w - q.dequantized) @ x.t()).norm())  # noqa: E731
    assert err(clipped) < err(plain)


def test_candidates_scored_in_chunks_pick_the_same_scale(rng, monkeypatch):
    """The GPU scores many candidates per launch, the CPU one at a time: the choice must not depend on it."""
    import salactl.quant.quantizer as quantizer
    spec = QuantSpec(4, 128, bf16_exact_scales=True)
    w = torch.randn(512, 128, generator=rng) * 0.02
    w[::3, 5] *= 9
    cw = torch.rand(128, generator=rng)
    one_at_a_time = clipped_group_scale(w, spec, cw)
    monkeypatch.setitem(quantizer._CLIP_CHUNK_ELEMENTS, "cpu", 1 << 24)
    assert torch.equal(clipped_group_scale(w, spec, cw), one_at_a_time)
    monkeypatch.setitem(quantizer._CLIP_CHUNK_ELEMENTS, "cpu", 7 * w.numel())      # uneven last chunk
    assert torch.equal(clipped_group_scale(w, spec, cw), one_at_a_time)


def test_static_groups_weigh_each_groups_errors_by_its_own_columns_hessian(rng):
    """Act-order with static groups: group j's scale is the clip search over the original columns of
    group j, weighted by those columns' Hessian diagonal (not the first group's)."""
    w, _, h = _problem(rng)
    spec = QuantSpec(4, 64)
    prep = prepare_hessian(h.h, 0.01, True, "t")
    got = gptq_quantize(w, prep, spec, clip_search=True).scales
    diag = torch.diagonal(prep.raw).float()
    want = torch.stack([clipped_group_scale(w[:, g0:g0 + 64].float(), spec, diag[g0:g0 + 64])
                        for g0 in range(0, w.shape[1], 64)])
    assert torch.equal(got.float(), want.float())
    first_groups_weights = torch.stack([clipped_group_scale(w[:, g0:g0 + 64].float(), spec, diag[:64])
                                        for g0 in range(0, w.shape[1], 64)])
    assert not torch.equal(got.float(), first_groups_weights.float())

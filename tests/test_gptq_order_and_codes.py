"""GPTQ details checked against reference/quantization.md §1 rather than against our own code:
act-order's column order (argsort of diag(H), descending), the symmetric 4-bit codes of a group's
extremes (scale = 2·xmax/15, zero = 8, q = clamp(round(w/scale) + 8, 0, 15)), and the clip search
reaching its smallest shrink (max-abs x 0.80)."""

import pytest
import torch

from salactl.quant.gptq import Hessian, gptq_quantize, prepare_hessian
from salactl.quant.quantizer import QuantSpec, clipped_group_scale
from salactl.quant.rtn import rtn_quantize


def _hessian(rng, k=64, tokens=1024):
    """Correlated inputs whose channels have distinct, shuffled magnitudes."""
    mix = torch.randn(k, k, generator=rng) / k ** 0.5
    x = torch.randn(tokens, k, generator=rng) @ mix + 0.1 * torch.randn(tokens, k, generator=rng)
    x = x * torch.linspace(0.2, 3.0, k)[torch.randperm(k, generator=rng)]
    h = Hessian(k, "cpu")
    h.add(x)
    return h.h


def test_act_order_takes_the_columns_by_decreasing_hessian_diagonal(rng):
    h = _hessian(rng)
    diag = torch.diagonal(h)
    assert len(set(diag.tolist())) == diag.numel()                   # no ties: one right order
    perm = prepare_hessian(h, 0.01, True, "t").perm
    assert sorted(perm.tolist()) == list(range(h.shape[0]))
    assert int(perm[0]) == int(diag.argmax()) and int(perm[-1]) == int(diag.argmin())
    assert bool((diag[perm][:-1] >= diag[perm][1:]).all())            # non-increasing
    assert prepare_hessian(h, 0.01, False, "t").perm is None


def test_act_order_quantizes_the_busiest_column_first(rng):
    """The first column GPTQ takes gets no error feedback: its codes are round-to-nearest's (static
    groups: the same scales). With act-order that is the column of the largest diag(H); the last
    one taken, the smallest, has absorbed the others' errors."""
    h = _hessian(rng)
    w = torch.randn(128, h.shape[0], generator=rng) * 0.05
    spec = QuantSpec(4, 32)
    q = gptq_quantize(w, prepare_hessian(h, 0.01, True, "t"), spec)
    rtn = rtn_quantize(w, spec)
    diag = torch.diagonal(h)
    first, last = int(diag.argmax()), int(diag.argmin())
    assert torch.equal(q.codes[:, first], rtn.codes[:, first])
    assert not torch.equal(q.codes[:, last], rtn.codes[:, last])


# xmax whose scale is exact in fp16 and bf16: 2 * 0.46875 / 15 = 1/16, so -xmax / scale is exactly
# -7.5 (no rounding of the scale can move it off the tie)
XMAX = 0.46875


@pytest.mark.parametrize("bf16_exact", [False, True])
def test_symmetric_4bit_codes_of_a_groups_extremes(bf16_exact):
    spec = QuantSpec(4, -1, bf16_exact_scales=bf16_exact)
    w = torch.tensor([[-XMAX, 0.0, XMAX]])
    ident = torch.eye(3)                     # diagonal H: no error feedback, GPTQ codes are RTN's
    gptq = gptq_quantize(w, prepare_hessian(ident, 0.01, False, "t"), spec)
    for q in (rtn_quantize(w, spec), gptq):
        assert q.scales.float().tolist() == [[1 / 16]]                 # 2·xmax / 15
        # round(-7.5) = -8 -> 0; 0 -> the zero, 8; round(7.5) = 8 -> 16, clamped to 15
        assert q.codes.tolist() == [[0, 8, 15]]
        assert q.dequantized.tolist() == [[-0.5, 0.0, 0.4375]]         # scale · (q − 8)


def test_a_groups_most_negative_weight_gets_code_0(rng):
    """Within a group of 32 whose largest magnitude is its most negative weight."""
    spec = QuantSpec(4, 32)
    w = (torch.rand(6, 64, generator=rng) * 1.8 - 0.9) * XMAX         # |w| < 0.9 xmax
    w[:, 5] = -XMAX                                                   # group 0's extreme
    w[:, 40] = -XMAX                                                  # group 1's
    q = rtn_quantize(w, spec)
    assert bool((q.scales.float() == 1 / 16).all())
    assert bool((q.codes[:, [5, 40]] == 0).all())
    others = torch.ones(64, dtype=torch.bool)
    others[[5, 40]] = False
    assert bool((q.codes[:, others] >= 1).all()) and int(q.codes.max()) <= 15
    assert bool((q.dequantized[:, [5, 40]] == -0.5).all())            # -8 · scale


def _fp16_scale(xmax: float) -> float:
    return float(torch.tensor(2 * xmax / 15).to(torch.float16).float())


def _weighted_error(w: torch.Tensor, scale: float, col_weight: torch.Tensor) -> torch.Tensor:
    """The clip search's objective per row, with the doc's quantizer:
    Σ_j c_j (w_j − scale·(q_j − 8))²."""
    q = torch.clamp(torch.round(w / scale) + 8, 0, 15)
    return ((w - scale * (q - 8)) ** 2 * col_weight).sum(1)


@pytest.mark.parametrize("via_gptq", [False, True])
def test_clip_search_reaches_a_20_percent_shrink(via_gptq):
    """Rows that all hold 1.0 in a column of tiny weight and otherwise lie on the grid of max-abs ×
    0.80 / 0.85 / 0.90: clipping to that grid is the best of the 21 candidates (max-abs shrunk by
    0 .. 20 %), by far better than the first few."""
    targets = (0.80, 0.85, 0.90)
    col_weight = torch.ones(32)
    col_weight[0] = 1e-4
    pattern = torch.tensor([(j % 16) - 8 for j in range(31)], dtype=torch.float32)   # codes 0 .. 15
    w = torch.stack([torch.cat([torch.ones(1), pattern * _fp16_scale(p)]) for p in targets])
    candidates = [_fp16_scale((100 - i) / 100) for i in range(21)]                     # max|w| = 1
    errors = torch.stack([_weighted_error(w, s, col_weight) for s in candidates])      # [21, rows]
    best = errors.argmin(0)
    assert [candidates[int(b)] for b in best] == [_fp16_scale(p) for p in targets]
    # shrinks of at most 2 % lose by far
    assert bool((errors[:3].min(0).values > 10 * errors.min(0).values).all())
    spec = QuantSpec(4, 32)
    if via_gptq:
        # diagonal H = the column weights: the clip search's weights are diag(H)
        got = gptq_quantize(w, prepare_hessian(torch.diag(col_weight), 0.01, False, "t"), spec,
                            clip_search=True).scales.float()[0]
    else:
        got = clipped_group_scale(w, spec, col_weight)
    assert got.tolist() == [_fp16_scale(p) for p in targets]

"""reference.top_blocks (select_blocks' last step) against an independent stable-sort oracle: the
same kept set on heavily tied scores (forced +inf, -1 candidates without a window, -inf), every keep."""

import math

import pytest
import torch

from salactl.runtime.ops.selection.reference import (
    block_scores, compress_keys, num_windows, select_blocks, top_blocks, window_scores,
)
from salactl.runtime.presets import sala_nano

INF = float("inf")


def sorted_first_keep(scores, keep):
    """DESIGN.md §2's rule spelled as a sort: the first `keep` of a stable descending order, not -inf."""
    order = torch.sort(scores, dim=-1, descending=True, stable=True).indices[..., :keep]
    chosen = torch.gather(scores, -1, order) > -INF
    return torch.zeros_like(scores, dtype=torch.bool).scatter_(-1, order, chosen)


@pytest.mark.parametrize("shape", [(2, 5, 7), (1, 3, 1), (3, 4, 64), (2, 9, 200), (2, 0, 6), (2, 3, 0)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_top_blocks_equals_the_stable_sort_on_tied_scores(shape, dtype):
    g = torch.Generator().manual_seed(sum(shape))
    values = torch.tensor([-INF, -1.0, 0.0, -0.0, 0.25, 0.5, INF], dtype=dtype)
    nb = shape[-1]
    for trial in range(40):
        scores = values[torch.randint(len(values), shape, generator=g)]
        if trial % 4 == 1:                          # also untied scores
            scores = torch.where(scores.isfinite() & (scores >= 0), torch.rand(shape, generator=g, dtype=dtype), scores)
        if trial % 4 == 2:                          # rows of -inf only, and rows with few candidates
            scores[..., ::2, :] = -INF
        for keep in sorted({min(k, nb) for k in (1, 2, 3, 6, nb - 1, nb) if min(k, nb) >= (1 if nb else 0)}):
            assert torch.equal(top_blocks(scores, keep), sorted_first_keep(scores, keep)), (trial, keep)


@pytest.mark.parametrize("keep", [0, 5, 9])
def test_a_keep_of_none_or_past_the_blocks_is_what_the_sort_keeps(keep):
    scores = torch.tensor([[0.5, -INF, 0.25], [INF, 0.0, 0.0]])
    assert torch.equal(top_blocks(scores, keep), sorted_first_keep(scores, keep))


def test_more_forced_blocks_than_keep_keeps_the_lowest_indexed():
    scores = torch.tensor([[0.9, INF, -1.0, INF, INF, -INF, INF]])
    assert top_blocks(scores, 2).nonzero()[:, 1].tolist() == [1, 3]
    assert torch.equal(top_blocks(scores, 2), sorted_first_keep(scores, 2))


def test_nan_scores_take_slots_without_being_kept_as_in_the_sort():
    g = torch.Generator().manual_seed(5)
    values = torch.tensor([-INF, -1.0, 0.5, INF, float("nan")])
    for _ in range(50):
        scores = values[torch.randint(len(values), (3, 4, 9), generator=g)]
        for keep in (1, 3, 9):
            assert torch.equal(top_blocks(scores, keep), sorted_first_keep(scores, keep))


def test_select_blocks_keeps_the_sorted_first_blocks_of_real_scores():
    sc = sala_nano().sparse_config
    g = torch.Generator().manual_seed(0)
    L, n = 3000, 70
    k, q = torch.randn(L, 2, 32, generator=g), torch.randn(n, 8, 32, generator=g)
    k[L // 2:] = k[:L - L // 2]                     # a repeated half: tied window scores
    pos = torch.cat([torch.arange(L - n + 10, L), torch.arange(10)])   # some rows with nothing visible
    k1, nb = compress_keys(k, sc, 0, num_windows(L, sc)), math.ceil(L / sc.block_size)
    scores = block_scores(window_scores(q, k1, pos, sc), pos, sc, nb)
    want = sorted_first_keep(scores, min(sc.selected_blocks, nb))
    assert torch.equal(select_blocks(q, k1, pos, sc, nb), want)

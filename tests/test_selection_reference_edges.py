"""Edges of the InfLLM-V2 selection reference (DESIGN.md §2) that the random-input tests do not reach:
a length of exactly one kernel, K1's fp32 mean, logits past fp32's range, init blocks past the query's
own block, and candidate blocks that no visible window overlaps (kernel_size > block_size)."""

import math

import pytest
import torch

from salactl.runtime.config import SparseConfig
from salactl.runtime.ops.selection.reference import (
    block_scores, compress_keys, num_windows, select_blocks, sparse_token_mask, window_scores,
)

INF = float("inf")


@pytest.mark.parametrize("ks,st", [(16, 8), (32, 16), (8, 8), (64, 16)])
def test_a_length_of_exactly_one_kernel_holds_one_window(ks, st):
    sc = SparseConfig(block_size=64, kernel_size=ks, kernel_stride=st)
    assert [num_windows(n, sc) for n in (0, 1, ks - 1, ks, ks + st - 1, ks + st)] == [0, 0, 0, 1, 1, 2]
    k = torch.arange(ks * 2 * 4, dtype=torch.float32).view(ks, 2, 4)
    k1 = compress_keys(k, sc, 0, num_windows(ks, sc))
    assert k1.shape == (1, 2, 4)
    assert torch.equal(k1[0], k.mean(0))


def _window_means(k, sc, nwin):
    return torch.stack([k[j * sc.kernel_stride:j * sc.kernel_stride + sc.kernel_size].double().mean(0)
                        for j in range(nwin)])


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32, torch.float64])
def test_compressed_keys_are_fp32_means_rounded_once_to_the_keys_dtype(dtype):
    """K1 = mean in fp32, stored in k's dtype, whatever the keys' dtype: for 16-bit keys one rounding of
    the exact mean (not a 16-bit running sum; fp16 keys whose window sum passes 65504 still average
    finitely), and fp64 keys are averaged in fp32 like every kernel's K1 (their fp64-only low bits drop)."""
    sc = SparseConfig(block_size=32, kernel_size=32, kernel_stride=16)
    g = torch.Generator().manual_seed(3)
    L = 96
    # odd multiples of 2^-3 below 2^9 (in bf16/fp16 still multiples of 2^-3): any fp32 sum of 32 is exact
    base = (2 * torch.randint(-2048, 2048, (L, 2, 8), generator=g) + 1).double() / 8
    if dtype == torch.float16:
        base[:, 0] = torch.randint(30000, 60000, (L, 8), generator=g).double()   # window sums ~1.4e6
    nwin = num_windows(L, sc)
    if dtype == torch.float64:
        k = base + torch.randint(1, 1000, base.shape, generator=g).double() * 2.0 ** -40   # lost in fp32
        want = _window_means(base, sc, nwin)
    else:
        k = base.to(dtype)
        want = _window_means(k, sc, nwin).to(dtype)          # the sums are exact in fp64: one rounding
    got = compress_keys(k, sc, 0, nwin)
    assert got.dtype == dtype and torch.isfinite(got).all()
    assert torch.equal(got, want)


def test_logits_past_fp32_range_keep_the_selection_budget():
    """Finite activations whose q·K1 overflows fp32 give a softmax row of NaN; the reference scores such
    a row's visible windows 0 (no NaN reaches the top-k, where it would take a slot without being kept),
    so every query still keeps min(topk + W/B, candidates) blocks."""
    sc = SparseConfig(block_size=16, kernel_size=16, kernel_stride=8, init_blocks=1, window_size=16,
                      topk=4, dense_len=0)
    g = torch.Generator().manual_seed(1)
    L, hkv, hq, d = 160, 2, 4, 8
    k = torch.randn(L, hkv, d, generator=g)
    k1 = compress_keys(k, sc, 0, num_windows(L, sc))
    pos = torch.tensor([20, 47, 90, 150, 159])
    q = torch.randn(len(pos), hq, d, generator=g)
    q[:, :2] *= 1e38                                # KV head 0's query heads: some logits are +inf
    s = window_scores(q, k1, pos, sc)
    assert not bool(s.isnan().any())
    visible = (torch.arange(k1.shape[0]) * sc.kernel_stride + sc.kernel_size - 1)[None, :] <= pos[:, None]
    assert bool((s[:, ~visible] == -INF).all()) and bool((s[:, visible] >= 0).all())
    nb = math.ceil(L / sc.block_size)
    kept = select_blocks(q, k1, pos, sc, nb)
    candidates = (pos // sc.block_size + 1)[None, :].expand(hkv, -1)
    assert torch.equal(kept.sum(-1), candidates.clamp(max=sc.selected_blocks))


def test_init_blocks_past_the_querys_own_block_are_not_kept():
    """init_blocks 3: a query in block 0 or 1 keeps its candidates only; the later init blocks are not
    candidates (-inf), neither forced in nor filling the slots left."""
    sc = SparseConfig(block_size=16, kernel_size=16, kernel_stride=8, init_blocks=3, window_size=16,
                      topk=4, dense_len=0)
    g = torch.Generator().manual_seed(2)
    L, nb = 96, 6
    k1 = compress_keys(torch.randn(L, 1, 8, generator=g), sc, 0, num_windows(L, sc))
    pos = torch.tensor([0, 5, 15, 16, 31, 40])
    q = torch.randn(len(pos), 2, 8, generator=g)
    scores = block_scores(window_scores(q, k1, pos, sc), pos, sc, nb)[0]
    own = (pos // sc.block_size).tolist()
    for row, o in zip(scores.tolist(), own):
        assert row[:o + 1] == [INF] * (o + 1) and row[o + 1:] == [-INF] * (nb - o - 1), (o, row)
    kept = select_blocks(q, k1, pos, sc, nb)[0]
    assert [r.nonzero().flatten().tolist() for r in kept] == [list(range(o + 1)) for o in own]


@pytest.mark.parametrize("topk,want", [(3, [0, 1, 2]), (2, [0, 2]), (1, [2])])
def test_candidates_without_a_visible_window_are_kept_after_the_forced_ones(topk, want):
    """kernel_size 64 > block_size 16: before key 63 no window is complete, so the query at 40 (block 2)
    scores its earlier blocks -1 (candidates with no visible window): kept, lowest index first, after its
    own forced block, while later blocks (-inf) never are (DESIGN.md §2.4: all candidates if fewer)."""
    sc = SparseConfig(block_size=16, kernel_size=64, kernel_stride=16, init_blocks=0, window_size=0,
                      topk=topk, dense_len=0)
    g = torch.Generator().manual_seed(4)
    L, nb = 80, 5
    k1 = compress_keys(torch.randn(L, 1, 8, generator=g), sc, 0, num_windows(L, sc))
    pos = torch.tensor([40])
    q = torch.randn(1, 2, 8, generator=g)
    s = window_scores(q, k1, pos, sc)
    assert bool((s == -INF).all())                                  # nothing visible yet
    assert block_scores(s, pos, sc, nb)[0, 0].tolist() == [-1.0, -1.0, INF, -INF, -INF]
    kept = select_blocks(q, k1, pos, sc, nb)
    assert kept[0, 0].nonzero().flatten().tolist() == want
    tokens = sparse_token_mask(kept, pos, L, sc.block_size)[0, 0]
    assert tokens.nonzero().flatten().tolist() == [t for b in want for t in range(16 * b, min(16 * b + 16, 41))]

"""The gathered sparse attention (runtime/ops/attention/gathered.py) against the definition:
reference.attention over sparse_token_mask, on random inputs and random kept-block sets."""

import pytest
import torch

from conftest import rel_err, run_backend, tiny_config
from salactl.runtime.backend_reference import ReferenceBackend
from salactl.runtime.kv_fp8 import dequantize_kv, quantize_kv
from salactl.runtime.ops.attention import gathered, reference
from salactl.runtime.ops.selection import sparse_token_mask


def _random_blocks(g, hkv, q_pos, num_blocks, keep, block_size):
    """Up to `keep` causal blocks per (KV head, row), some rows keeping fewer; block 0 always kept."""
    mask = torch.zeros(hkv, len(q_pos), num_blocks, dtype=torch.bool)
    for h in range(hkv):
        for i, t in enumerate(q_pos.tolist()):
            own = t // block_size
            take = int(torch.randint(1, keep + 1, (1,), generator=g))
            pick = torch.randperm(own + 1, generator=g)[:take]
            mask[h, i, pick] = True
            mask[h, i, 0] = True if mask[h, i].sum() < keep else mask[h, i, 0]
    return mask


@pytest.mark.parametrize("n,L,dtype", [(1, 300, torch.float32), (40, 300, torch.float32), (17, 129, torch.bfloat16),
                                       (64, 1000, torch.float32)])
def test_gathered_equals_the_masked_reference(n, L, dtype):
    g = torch.Generator().manual_seed(n + L)
    hq, hkv, d, B, keep = 8, 2, 32, 16, 5
    q = torch.randn(n, hq, d, generator=g).to(dtype)
    k = torch.randn(L, hkv, d, generator=g).to(dtype)
    v = torch.randn(L, hkv, d, generator=g).to(dtype)
    q_pos = torch.arange(L - n, L)
    blocks = _random_blocks(g, hkv, q_pos, -(-L // B), keep, B)
    want = reference.attention(q, k, v, q_pos, sparse_token_mask(blocks, q_pos, L, B))
    got = gathered.selected_attention(q, k, v, q_pos, blocks, B, keep)
    assert got.dtype == dtype and got.shape == want.shape
    assert rel_err(got.float(), want.float()) < (1e-6 if dtype == torch.float32 else 1e-2)


def test_row_groups_give_the_same_rows(monkeypatch):
    g = torch.Generator().manual_seed(7)
    n, L, hq, hkv, d, B, keep = 33, 400, 4, 2, 16, 16, 4
    q, k, v = (torch.randn(a, h, d, generator=g) for a, h in ((n, hq), (L, hkv), (L, hkv)))
    q_pos = torch.arange(L - n, L)
    blocks = _random_blocks(g, hkv, q_pos, -(-L // B), keep, B)
    whole = gathered.selected_attention(q, k, v, q_pos, blocks, B, keep)
    monkeypatch.setattr(gathered, "ROW_GROUP_BYTES", 1)                 # one row per group
    assert torch.equal(gathered.selected_attention(q, k, v, q_pos, blocks, B, keep), whole)


CHUNKS = [50, 100, 147, 1, 1, 1]     # prefill chunks (dense rows, sparse rows, both), then decode


def _layer_inputs(seed):
    """A config with sparse rows past 64 tokens, and 300 tokens' q, k, v for one of its sparse layers."""
    cfg = tiny_config(dense_len=64, topk=2, window_size=32)
    g = torch.Generator().manual_seed(seed)
    return cfg, [torch.randn(300, h, cfg.head_dim, generator=g)
                 for h in (cfg.num_attention_heads, cfg.num_key_value_heads, cfg.num_key_value_heads)]


def test_backend_gathers_what_the_masked_definition_attends():
    """Chunked prefill then decode through the reference backend: gathering the kept blocks gives
    the masked definition's outputs (dense rows, sparse rows and chunks mixing both)."""
    cfg, (q, k, v) = _layer_inputs(seed=3)
    got = run_backend(cfg, q, k, v, CHUNKS, ReferenceBackend(cfg))
    want = run_backend(cfg, q, k, v, CHUNKS, ReferenceBackend(cfg, gather_sparse=False))
    assert rel_err(got, want) < 1e-6


@pytest.mark.parametrize("fp8", [torch.float8_e4m3fn, torch.float8_e5m2])
def test_fp8_keys_are_dequantized_after_the_gather_to_the_same_values(fp8):
    """An FP8 cache hands over its stored bytes and scales: the kept tokens dequantized after the
    gather are the values a whole-cache dequantization gives, so the outputs are equal bit for bit."""
    g = torch.Generator().manual_seed(11)
    n, L, hq, hkv, d, B, keep = 9, 500, 8, 2, 32, 16, 5
    q = torch.randn(n, hq, d, generator=g).bfloat16()
    ks, vs = torch.tensor([0.01, 0.03]), torch.tensor([0.02, 0.005])
    k8 = quantize_kv(torch.randn(L, hkv, d, generator=g), ks, fp8)
    v8 = quantize_kv(torch.randn(L, hkv, d, generator=g), vs, fp8)
    q_pos = torch.arange(L - n, L)
    blocks = _random_blocks(g, hkv, q_pos, -(-L // B), keep, B)
    got = gathered.selected_attention(q, k8, v8, q_pos, blocks, B, keep, (ks, vs))
    want = gathered.selected_attention(q, dequantize_kv(k8, ks, torch.bfloat16),
                                       dequantize_kv(v8, vs, torch.bfloat16), q_pos, blocks, B, keep)
    assert torch.equal(got, want)


def test_fp8_cache_through_the_backend_matches_the_masked_definition():
    cfg, (q, k, v) = _layer_inputs(seed=5)
    scales = {i: (torch.full((2,), 0.01), torch.full((2,), 0.02)) for i in cfg.sparse_layers}
    fp8 = {"kv_cache_dtype": "fp8_e4m3", "kv_scales": scales}
    got = run_backend(cfg, q, k, v, CHUNKS, ReferenceBackend(cfg), **fp8)
    want = run_backend(cfg, q, k, v, CHUNKS, ReferenceBackend(cfg, gather_sparse=False), **fp8)
    assert rel_err(got, want) < 1e-6
    assert rel_err(got, run_backend(cfg, q, k, v, CHUNKS)) < 0.1         # close to the unquantized cache


def test_a_mask_keeping_more_blocks_than_keep_is_refused_not_truncated():
    q, k, v = torch.randn(1, 4, 8), torch.randn(64, 2, 8), torch.randn(64, 2, 8)
    blocks = torch.ones(2, 1, 4, dtype=torch.bool)
    with pytest.raises(ValueError, match="more than keep=3"):
        gathered.selected_attention(q, k, v, torch.tensor([63]), blocks, 16, 3)

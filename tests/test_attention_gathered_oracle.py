"""gathered.selected_attention against a dense masked softmax written out here in float64, one
(KV head, row) at a time: partial last block, GQA groups, rows keeping fewer than keep, FP8 caches."""

import math

import pytest
import torch

from salactl.runtime.kv_fp8 import quantize_kv
from salactl.runtime.ops.attention.gathered import selected_attention


def dense_oracle(q, k, v, q_pos, block_mask, block_size):
    n, hq, d = q.shape
    hkv = k.shape[1]
    out = torch.zeros(n, hq, d, dtype=torch.float64)
    for h in range(hkv):
        for i, t in enumerate(q_pos.tolist()):
            keys = [j for j in range(t + 1) if block_mask[h, i, j // block_size]]
            for head in range(h * (hq // hkv), (h + 1) * (hq // hkv)):
                p = torch.softmax(k[keys, h].double() @ q[i, head].double() / math.sqrt(d), dim=0)
                out[i, head] = p @ v[keys, h].double()
    return out


def random_mask(g, hkv, q_pos, num_blocks, keep, block_size):
    """1..keep causal blocks per (KV head, row), the query's own (possibly partial) block always."""
    mask = torch.zeros(hkv, len(q_pos), num_blocks, dtype=torch.bool)
    for h in range(hkv):
        for i, t in enumerate(q_pos.tolist()):
            own = t // block_size
            take = int(torch.randint(0, keep, (1,), generator=g))
            mask[h, i, torch.randperm(own, generator=g)[:take]] = True
            mask[h, i, own] = True
    return mask


@pytest.mark.parametrize("n,L,hq,hkv,B,keep,dtype", [
    (5, 203, 8, 2, 16, 4, torch.float32),      # partial last block, GQA 4:1
    (12, 256, 4, 4, 32, 3, torch.float32),     # whole blocks, no grouping
    (7, 97, 6, 1, 8, 20, torch.bfloat16),      # keep above the blocks a row can have
])
def test_gathered_equals_a_dense_masked_softmax(n, L, hq, hkv, B, keep, dtype):
    g = torch.Generator().manual_seed(L)
    d = 16
    q, k, v = (torch.randn(a, h, d, generator=g).to(dtype) for a, h in ((n, hq), (L, hkv), (L, hkv)))
    q_pos = torch.cat([torch.arange(L - n + 1, L), torch.tensor([B + 1])])   # a row early in the cache
    mask = random_mask(g, hkv, q_pos, -(-L // B), min(keep, -(-L // B)), B)
    got = selected_attention(q, k, v, q_pos, mask, B, keep)
    want = dense_oracle(q, k, v, q_pos, mask, B)
    assert got.dtype == dtype
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(got.double(), want, rtol=tol, atol=tol)


@pytest.mark.parametrize("fp8", [torch.float8_e4m3fn, torch.float8_e5m2])
def test_gathered_fp8_cache_equals_a_dense_masked_softmax_of_its_values(fp8):
    g = torch.Generator().manual_seed(3)
    n, L, hq, hkv, d, B, keep = 6, 150, 8, 2, 16, 16, 4
    q = torch.randn(n, hq, d, generator=g)
    ks, vs = torch.tensor([0.01, 0.04]), torch.tensor([0.03, 0.005])
    k8 = quantize_kv(torch.randn(L, hkv, d, generator=g), ks, fp8)
    v8 = quantize_kv(torch.randn(L, hkv, d, generator=g), vs, fp8)
    q_pos = torch.arange(L - n, L)
    mask = random_mask(g, hkv, q_pos, -(-L // B), keep, B)
    got = selected_attention(q, k8, v8, q_pos, mask, B, keep, (ks, vs))
    values = [x.float() * s[:, None] for x, s in ((k8, ks), (v8, vs))]        # the stored values
    torch.testing.assert_close(got.double(), dense_oracle(q, *values, q_pos, mask, B), rtol=1e-5, atol=1e-5)

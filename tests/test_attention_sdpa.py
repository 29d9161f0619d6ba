import pytest
import torch

from salactl.runtime.gpu.selfcheck import rel_err
from salactl.runtime.ops.attention import reference, sdpa


@pytest.mark.parametrize("n,L,dtype,sparse", [(37, 37, torch.float32, False), (5, 300, torch.bfloat16, False),
                                              (64, 200, torch.float32, True), (1, 129, torch.float32, True)])
def test_sdpa_attention_matches_the_reference(n, L, dtype, sparse):
    g = torch.Generator().manual_seed(n * 1000 + L)
    hq, hkv, d = 8, 2, 32
    q = torch.randn(n, hq, d, generator=g).to(dtype)
    k = torch.randn(L, hkv, d, generator=g).to(dtype)
    v = torch.randn(L, hkv, d, generator=g).to(dtype)
    q_pos = torch.arange(L - n, L)                       # the last n positions (prefill chunk or decode)
    allowed = None
    if sparse:                                           # causal, minus random keys per KV head; self kept
        causal = torch.arange(L)[None, :] <= q_pos[:, None]
        keep = torch.rand(hkv, n, L, generator=g) < 0.4
        keep[:, torch.arange(n), q_pos] = True
        allowed = causal[None] & keep
    want = reference.attention(q, k, v, q_pos, allowed)
    got = sdpa.attention(q, k, v, q_pos, allowed)
    assert got.dtype == dtype and got.shape == want.shape
    assert rel_err(got.float(), want.float()) < (1e-5 if dtype == torch.float32 else 1e-2)

"""The Gluon mma.sync W4A16 kernel (runtime/ops/w4a16/gluon_mma.py) against the fp32 dequant-matmul
reference on the GPU: every launch variant, ragged slab counts, 1-8 rows, bf16 and fp16, groups of
128 / 256 / all of K. Gluon kernels have no interpreter, so there is no CPU twin: skipped without CUDA."""

import pytest
import torch

from conftest import gpu

pytestmark = [pytest.mark.gpu, gpu]

# R slabs, W warps, U blocks per step, bias MMA, register prefetch depth, fence
CONFIGS = [(1, 8, 4, 1, 0, 0), (1, 8, 4, 0, 0, 2), (1, 8, 1, 1, 1, 2), (1, 8, 1, 1, 2, 2), (2, 4, 1, 0, 2, 2),
           (4, 4, 1, 1, 1, 2), (2, 8, 2, 1, 0, 2), (1, 4, 2, 1, 1, 0)]


def _case(N, K, M, group, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    q = torch.randint(0, 16, (K, N), generator=g, dtype=torch.int32)
    gs = K if group == -1 else group
    s = (torch.rand(K // gs, N, generator=g) * 2e-3 + 1e-3).half()
    w = (q.float() - 8) * s.float().repeat_interleave(gs, 0)                       # [K, N]
    x = torch.randn(M, K, generator=g).to(dtype)
    return q, s, x, x.float() @ w


@pytest.mark.parametrize("cfg", CONFIGS, ids=lambda c: "R{}W{}U{}b{}pf{}f{}".format(*c))
@pytest.mark.parametrize("N,K,M,group,dtype", [
    (4096, 4096, 1, 128, torch.bfloat16),
    (272, 1152, 8, -1, torch.bfloat16),          # 17 slabs: a ragged last CTA for R = 2 / 4
    (48, 384, 3, 128, torch.float16),            # fewer blocks than warps
    (4096 + 48, 1024, 5, 256, torch.float16),
])
def test_gluon_w4a16_matches_reference(cfg, N, K, M, group, dtype):
    from salactl.runtime.ops.w4a16.gluon_mma import w4a16_mma
    from salactl.runtime.ops.w4a16.layout import pack_tc

    q, s, x, ref = _case(N, K, M, group, dtype, seed=N + K + M)
    r, w, u, b, pf, fence = cfg
    y = w4a16_mma(x.cuda(), pack_tc(q).cuda(), s.cuda(), group, R=r, W=w, U=u, bias_mma=bool(b), pf=pf,
                  fence=fence).float().cpu()
    assert y.shape == (M, N)
    err = float((y - ref).norm() / ref.norm())
    assert err < 1e-2, err
    # every row and token was written (no stale or missing tile)
    assert float(((y - ref).abs().amax(dim=0) / ref.abs().amax(dim=0).clamp_min(1e-6)).max()) < 0.05

"""Our Triton W4A16 kernels against the plain reference: on CPU through the Triton interpreter (in a
subprocess, because TRITON_INTERPRET must be set before triton compiles anything), and on CUDA."""

import importlib.util
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from conftest import gpu, rel_err

needs_triton = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton not installed")

_INTERPRETED_CHECK = textwrap.dedent("""
    import torch
    from salactl.runtime.ops.w4a16.layout import pack_interleaved
    from salactl.runtime.ops.w4a16.triton import MMConfig, w4a16_dequantize, w4a16_mm
    from salactl.runtime.ops.w4a16.triton_gemv import w4a16_gemv
    gen = torch.Generator().manual_seed(7)
    K, N = 256, 48                                   # N not a multiple of the tile: masked columns
    for G, dt, M, cfg, tol in [(128, torch.bfloat16, 1, MMConfig(16, 32, 1), 5e-3),
                               (32, torch.bfloat16, 2, MMConfig(16, 32, 3), 5e-3),
                               (32, torch.float16, 5, MMConfig(16, 32, 3), 5e-3),
                               (-1, torch.bfloat16, 17, MMConfig(16, 64, 2, True), 5e-3),
                               (64, torch.bfloat16, 3, MMConfig(16, 32, 1, True), 1.5e-2)]:
        ng = 1 if G == -1 else K // G
        q = torch.randint(0, 16, (K, N), generator=gen)
        s = (torch.rand(ng, N, generator=gen) * 0.01 + 0.001).half()
        w = ((q.float() - 8) * s.float()[torch.arange(K) // (K if G == -1 else G)]).t()
        x = torch.randn(M, K, generator=gen).to(dt)
        ref = x.float() @ w.t()
        y = w4a16_mm(x, pack_interleaved(q), s, G, cfg)
        assert y.dtype == dt and y.shape == (M, N)
        err = float((y.float() - ref).norm() / ref.norm())
        assert err < tol, (G, M, cfg, err)
        if dt == torch.bfloat16 and M <= 5:
            for split in (1, 3):                       # split 3: partials + last-split reduction
                for _ in range(2):                     # the second call checks the counter reset
                    yg = w4a16_gemv(x, pack_interleaved(q), s, G, block_n=32, split_k=split)
                    eg = float((yg.float() - ref).norm() / ref.norm())
                    assert eg < 5e-3, ("gemv", G, M, split, eg)
        wd = w4a16_dequantize(pack_interleaved(q), s, G, dt).float()
        assert bool(((wd - w.t()).abs() <= w.t().abs() * 2 ** -7 + 1e-7).all()), G
    print("ok")
""")


@needs_triton
def test_triton_kernels_match_reference_in_the_interpreter():
    root = Path(__file__).resolve().parent.parent
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=str(root))
    r = subprocess.run([sys.executable, "-c", _INTERPRETED_CHECK], env=env, capture_output=True, text=True,
                       timeout=600, cwd=root)
    assert r.returncode == 0 and "ok" in r.stdout, r.stderr[-3000:]


@gpu
@needs_triton
@pytest.mark.parametrize("G", [128, 64, -1])
@pytest.mark.parametrize("M", [1, 2, 8, 33, 600])
def test_w4a16_linear_on_cuda_matches_reference(G, M):
    from salactl.quant.linear import W4A16Linear
    from salactl.quant.packing import default_g_idx, to_gptq_tensors
    from salactl.runtime.ops.w4a16 import reference

    gen = torch.Generator().manual_seed(M)
    K, N = 1024, 320
    codes = torch.randint(0, 16, (N, K), generator=gen)
    scales = (torch.rand(1 if G == -1 else K // G, N, generator=gen) * 0.01 + 0.001).half()
    t = to_gptq_tensors(codes, scales, default_g_idx(K, G), 4)
    mod = W4A16Linear.from_gptq(t["qweight"], t["scales"], t["g_idx"], 4, G, "cuda", torch.bfloat16)
    assert mod.layout == "triton"
    x = torch.randn(M, K, generator=gen).bfloat16()
    ref = reference.w4a16_matmul(x.float(), t["qweight"], t["scales"], t["g_idx"], 4)
    y = mod(x.cuda())
    assert torch.isfinite(y).all()
    assert rel_err(y.float().cpu(), ref) < 1e-2

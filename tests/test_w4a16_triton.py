"""Our Triton W4A16 kernel against the plain reference: on CPU-only machines through the Triton
interpreter (in a subprocess, because TRITON_INTERPRET must be set before triton compiles anything;
the kernel then runs its plain-Triton dequantization), and on CUDA (the inline-PTX dequantization)."""

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

_INTERPRETED_TC_CHECK = textwrap.dedent("""
    import torch
    from salactl.runtime.ops.w4a16.layout import pack_tc
    from salactl.runtime.ops.w4a16.tc_config import TCConfig
    from salactl.runtime.ops.w4a16.triton_tc import w4a16_tc, w4a16_tc_dequantize
    gen = torch.Generator().manual_seed(7)
    K, N = 384, 48                       # 3 K blocks; N = 3 row groups: masked groups when BLOCK_N = 32/64
    cases = [(128, torch.bfloat16, 1, TCConfig(16, 16, 1, bias_dot=True)),
             (128, torch.bfloat16, 5, TCConfig(32, 16, 2, bias_dot=False, unroll=2)),   # 2 splits, odd tail
             (128, torch.bfloat16, 2, TCConfig(32, 16, 1, bias_dot=False, unroll=4)),   # 3 blocks, unroll 4
             (128, torch.float16, 4, TCConfig(64, 16, 3, bias_dot=True, unroll=2)),
             (-1, torch.bfloat16, 17, TCConfig(16, 16, 2, bias_dot=True)),             # two M tiles
             (32, torch.bfloat16, 2, TCConfig(32, 16, 2, unroll=2)),
             (128, torch.bfloat16, 3, TCConfig(16, 16, 2, bias_dot=False, prefetch=True)),
             (32, torch.bfloat16, 1, TCConfig(32, 16, 1, bias_dot=True, prefetch=True)),
             (64, torch.float16, 3, TCConfig(16, 16, 1)),
             # register software pipeline over groups of 2/4 blocks, masked tails; chunked split-K sums
             (128, torch.bfloat16, 3, TCConfig(32, 16, 2, bias_dot=False, unroll=2, prefetch=True, reduce=2)),
             (128, torch.float16, 2, TCConfig(16, 16, 3, bias_dot=False, unroll=4, prefetch=True, reduce=4)),
             (-1, torch.bfloat16, 17, TCConfig(64, 16, 1, bias_dot=True, unroll=4, prefetch=True)),
             # TMA words (and scales; tma=2 activations too) in a num_stages-deep loop: split-K with an
             # odd tail, N not a multiple of BLOCK_N (the tile's extra rows are the next block's words),
             # small groups, two M tiles (rows >= M of the activation box are TMA's zero fill)
             (128, torch.bfloat16, 1, TCConfig(64, 16, 1, bias_dot=False, num_stages=3, tma=1)),
             (128, torch.bfloat16, 5, TCConfig(64, 16, 2, bias_dot=False, num_stages=4, reduce=2, tma=1)),
             (128, torch.float16, 3, TCConfig(64, 16, 1, bias_dot=True, num_stages=3, tma=2)),
             (32, torch.bfloat16, 2, TCConfig(64, 16, 3, bias_dot=False, num_stages=2, tma=2)),
             (-1, torch.bfloat16, 17, TCConfig(64, 16, 2, bias_dot=True, num_stages=3, tma=2)),
             # two blocks per TMA copy (a trailing K: 6 blocks): splits rounded up to whole pairs (split 2:
             # 4 + 2 blocks; split 4: 2 + 2 + 2 + an empty split), groups of 384 that start inside a pair
             (384, torch.bfloat16, 1, TCConfig(64, 16, 2, num_stages=3, tma=1, tma_blocks=2), 768),
             (128, torch.float16, 5, TCConfig(64, 16, 4, bias_dot=True, num_stages=2, reduce=2, tma=2, tma_blocks=2),
              768),
             (32, torch.bfloat16, 3, TCConfig(64, 16, 1, num_stages=4, tma=2, tma_blocks=2), 768),
             (-1, torch.bfloat16, 2, TCConfig(64, 16, 2, num_stages=3, tma=1, tma_blocks=2), 768),
             # an L2 prefetch of the first blocks' words before the PDL wait (TMA and register kernels;
             # a no-op without PDL, so this checks that the rest of the kernel is unchanged)
             (128, torch.bfloat16, 2, TCConfig(64, 16, 2, num_stages=3, tma=1, early=True)),
             (128, torch.bfloat16, 3, TCConfig(32, 16, 2, bias_dot=False, unroll=4, early=True))]
    for G, dt, M, cfg, *k in cases:
        K = k[0] if k else 384
        ng = 1 if G == -1 else K // G
        q = torch.randint(0, 16, (K, N), generator=gen)
        s = (torch.rand(ng, N, generator=gen) * 0.01 + 0.001).half()
        w = ((q.float() - 8) * s.float()[torch.arange(K) // (K if G == -1 else G)]).t()
        x = torch.randn(M, K, generator=gen).to(dt)
        ref = x.float() @ w.t()
        tol = 8e-3 if G < 128 and G != -1 else 5e-3    # small groups scale bf16/fp16 weights before the MMA
        for _ in range(2 if cfg.split_k > 1 else 1):    # the second call checks the split-K counter reset
            y = w4a16_tc(x, pack_tc(q), s, G, cfg)
            assert y.dtype == dt and y.shape == (M, N)
            err = float((y.float() - ref).norm() / ref.norm())
            assert err < tol, (G, dt, M, cfg, err)
        if cfg.unroll == 1:
            wd = w4a16_tc_dequantize(pack_tc(q), s, G, dt, block_n=32).float()
            assert bool(((wd - w).abs() <= w.abs() * 2 ** -7 + 1e-7).all()), (G, dt)
    # tma=2 reads activations by TMA: a column slice (base and row stride not 16-byte aligned) is copied
    x = torch.randn(3, K + 4, generator=gen).bfloat16()[:, 4:]
    y = w4a16_tc(x, pack_tc(q), s, G, TCConfig(64, 16, 2, num_stages=3, tma=2))
    assert float((y.float() - x.float() @ w.t()).norm() / (x.float() @ w.t()).norm()) < tol
    print("ok")
""")


interpreted = pytest.mark.skipif(torch.cuda.is_available(), reason="interpreter check is for CPU-only machines; "
                                 "on CUDA the gpu tests run the real kernel")


def _run_interpreted(script: str) -> None:
    """Run a check script under TRITON_INTERPRET=1 in a fresh process; it prints "ok" when it passes."""
    root = Path(__file__).resolve().parent.parent
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=str(root))
    r = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=600, cwd=root)
    assert r.returncode == 0 and "ok" in r.stdout, r.stderr[-3000:]


@needs_triton
@interpreted
def test_tensor_core_kernel_matches_reference_in_the_interpreter():
    _run_interpreted(_INTERPRETED_TC_CHECK)


def test_config_specs_give_the_split_unroll_and_tile_they_describe():
    """tc_config_from_spec on the 9B shapes (132 SMs): split from waves (rounded, or down with fit),
    unroll cut to the blocks a split has, BLOCK_N halved for
    narrow N; the dispatch reads TC_SHAPE_DEFAULTS before TC_DEFAULTS. Needs no triton."""
    from salactl.runtime.ops.w4a16 import tc_config as tc

    spec = "bn=64,w=4,bias=0,un=4,pf=0,stages=1,waves=4,red=1"         # TC_DEFAULTS[16] at 59939ab
    # (N, K, M) -> (split, unroll)
    want = {(4096, 4096, 1): (8, 4), (256, 4096, 8): (32, 1), (16384, 4096, 1): (2, 4), (4096, 16384, 8): (8, 4),
            (32768, 4096, 1): (1, 4), (8704, 4096, 1): (4, 4), (8192, 1024, 1): (4, 2)}
    for (N, K, M), (split, unroll) in want.items():
        c = tc.tc_config_from_spec(spec, M, N, K, 132)
        assert (c.block_n, c.block_m, c.num_warps, c.bias_dot, c.split_k, c.unroll, c.num_stages) == \
            (64, 16, 4, False, split, unroll, 1), (N, K, M, c)
    c = tc.tc_config_from_spec("bn=64,un=2,pf=1,waves=4,fit=1,red=4", 32, 8704, 4096, 132)
    assert (c.block_m, c.split_k, c.unroll, c.prefetch, c.reduce) == (32, 3, 2, 1, 4)   # 136 tiles x 3 <= 528
    c = tc.tc_config_from_spec("bn=128,w=8,split=5", 1, 48, 4096, 132)
    assert (c.block_n, c.block_m, c.split_k) == (32, 16, 5)
    # the TMA loop pipelines through shared memory: unroll / prefetch do not apply
    c = tc.tc_config_from_spec("bn=128,w=4,un=4,pf=1,stages=5,waves=2,tma=2,tkb=2", 1, 16384, 4096, 132)
    assert (c.block_n, c.split_k, c.unroll, c.prefetch, c.num_stages, c.tma, c.tma_blocks) == (128, 2, 1, 0, 5, 2, 2)
    assert tc.tc_config_from_spec("tma=1,tkb=2", 1, 256, 384, 132).tma_blocks == 1     # 3 blocks: no pairs
    assert tc.tc_config_from_spec("bn=64", 1, 16384, 4096, 132).tma == 0
    # ew=E: E x the first unroll group (x 2 with the register prefetch) or E x the TMA pipeline's first
    # stages, at most the split's blocks; ew=-1: all of them
    assert tc.tc_config_from_spec("bn=64,tma=1,stages=4,ew=1", 1, 16384, 4096, 132).prefetch_blocks(32) == 3
    assert tc.tc_config_from_spec("bn=64,tma=1,tkb=2,stages=3,ew=2", 1, 16384, 4096, 132).prefetch_blocks(32) == 8
    assert tc.tc_config_from_spec("bn=64,un=4,ew=1", 1, 16384, 4096, 132).prefetch_blocks(32) == 4
    assert tc.tc_config_from_spec("bn=64,un=2,pf=1,ew=2", 1, 16384, 4096, 132).prefetch_blocks(32) == 8
    assert tc.tc_config_from_spec("bn=64,un=2,pf=1,ew=2", 1, 16384, 4096, 132).prefetch_blocks(6) == 6
    assert tc.tc_config_from_spec("bn=64,un=4", 1, 16384, 4096, 132).prefetch_blocks(32) == 0
    assert tc.tc_config_from_spec("bn=128,tma=1,ew=-1", 1, 16384, 4096, 132).prefetch_blocks(8) == 8
    assert [tc.split_blocks(4096, s) for s in (1, 3, 4, 5)] == [32, 11, 8, 7]
    assert tc.split_blocks(4096, 3, 2) == 12 and tc.split_blocks(384, 2, 2) == 2
    assert tc.tc_config_from_spec("bn=64,tma=1", 1, 48, 4096, 132).tma == 0        # BLOCK_N 32: no TMA
    with pytest.raises(ValueError):
        tc.parse_tc_spec("bn=64,unroll=2")
    for bm, spec in tc.TC_DEFAULTS.items():       # 12288x4096: no per-shape default
        assert tc.default_tc_config(bm, 12288, 4096, 132) == tc.tc_config_from_spec(spec, bm, 12288, 4096, 132)
    for (n, k, bm), spec in tc.TC_SHAPE_DEFAULTS.items():
        assert tc.default_tc_config(bm, n, k, 132) == tc.tc_config_from_spec(spec, bm, n, k, 132)
    saved = dict(tc.TC_SHAPE_DEFAULTS)
    tc.TC_SHAPE_DEFAULTS[(16384, 4096, 16)] = "bn=128,w=4,un=1,pf=1,waves=3,fit=1,red=4"
    try:
        assert tc.default_tc_config(1, 16384, 4096, 132) == tc.TCConfig(128, 16, 3, 4, 1, False, 1, 1, 4)
    finally:
        tc.TC_SHAPE_DEFAULTS.clear()
        tc.TC_SHAPE_DEFAULTS.update(saved)


def test_tensor_core_layout_round_trip_and_word_order(rng):
    from salactl.runtime.ops.w4a16.layout import pack_tc, unpack_tc

    q = torch.randint(0, 16, (256, 32), generator=rng)
    w = pack_tc(q)
    assert w.shape == (2, 2, 256) and w.dtype == torch.int32 and torch.equal(unpack_tc(w), q.to(torch.int32))
    # block kb=1, row group g=1, n8=1, nlo=3 (row 16 + 8 + 3 = 27), c=2, blk=1: word 128 + 48 + 8 + 1;
    # nibble p holds k = 128 + 32 + 16·tile + 8·half8 + 4 + pair with p = (2·half8 + tile) + 4·pair
    word = int(w[1, 1, 128 + 3 * 16 + 2 * 4 + 1]) & 0xFFFFFFFF
    for tile in (0, 1):
        for half8 in (0, 1):
            for pair in (0, 1):
                p = 2 * half8 + tile + 4 * pair
                assert (word >> (4 * p)) & 0xF == int(q[128 + 32 + 16 * tile + 8 * half8 + 4 + pair, 27])


def test_tensor_core_layout_rejects_bad_shapes():
    from salactl.errors import QuantizationError
    from salactl.runtime.ops.w4a16.layout import pack_tc

    with pytest.raises(QuantizationError):
        pack_tc(torch.zeros(200, 16, dtype=torch.int32))
    with pytest.raises(QuantizationError):
        pack_tc(torch.zeros(256, 24, dtype=torch.int32))


@gpu
@needs_triton
@pytest.mark.parametrize("G", [128, 64, -1])
@pytest.mark.parametrize("M", [1, 2, 8, 33, 600])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])      # float32: bf16 activations
def test_w4a16_linear_on_cuda_matches_reference(G, M, dtype):
    from salactl.quant.linear import GPTQLinear
    from salactl.quant.packing import default_g_idx, to_gptq_tensors
    from salactl.runtime.ops.w4a16 import reference

    gen = torch.Generator().manual_seed(M)
    K, N = 1024, 320
    codes = torch.randint(0, 16, (N, K), generator=gen)
    scales = (torch.rand(1 if G == -1 else K // G, N, generator=gen) * 0.01 + 0.001).half()
    t = to_gptq_tensors(codes, scales, default_g_idx(K, G), 4)
    mod = GPTQLinear.from_gptq(t["qweight"], t["scales"], t["g_idx"], 4, G, "cuda", dtype)
    assert mod.layout == "triton"
    x = torch.randn(M, K, generator=gen).to(dtype)
    ref = reference.w4a16_matmul(x.float(), t["qweight"], t["scales"], t["g_idx"], 4)
    y = mod(x.cuda())
    assert torch.isfinite(y).all() and y.dtype == dtype
    if dtype == torch.float32:
        assert rel_err(mod.forward_glu(x.cuda()).float().cpu(),
                       torch.nn.functional.silu(ref[:, :N // 2]) * ref[:, N // 2:]) < 2e-2
    assert rel_err(y.float().cpu(), ref) < 1e-2


@gpu
@needs_triton
@pytest.mark.parametrize("cfg", ["bn64 w4 fma", "bn64 w4 bias", "bn128 w4 bias un2", "bn128 w8 fma un2",
                                 "bn64 w4 fma pf", "bn128 w8 bias pf", "bn64 w4 fma un4", "bn64 w4 fma st3",
                                 "bn64 w4 fma un2 pf red8", "bn64 w4 fma un4 pf red2", "bn32 w2 fma un2 pf",
                                 "bn16 w1 fma un4", "bn64 w4 fma un2 pf2 red4", "bn128 w4 fma pf2",
                                 "bn128 w4 fma pf red4", "bn64 w4 fma tma1 st4", "bn64 w4 bias tma2 st3",
                                 "bn128 w4 fma tma2 st6 red4", "bn128 w8 fma tma1 st5", "bn64 w2 fma tma2 st2",
                                 "bn128 w4 fma tma1 st3", "bn64 w4 fma tma1 tkb2 st3",
                                 "bn128 w4 fma tma2 tkb2 st3 red4", "bn128 w4 fma tma1 tkb2 st4", "bn128 w4 fma tma1 st4 ew",
                                 "bn64 w4 fma tma1 tkb2 st3 ew", "bn64 w4 fma un4 ew", "bn64 w4 bias un4 ew",
                                 "bn64 w4 fma un2 pf ew", "bn128 w4 fma tma1 st4 ewall", "bn64 w4 fma un4 ewall"])
@pytest.mark.parametrize("dt", [torch.bfloat16, torch.float16])
def test_tensor_core_kernel_inline_asm_on_cuda(cfg, dt):
    """The inline-PTX dequantization (which the interpreter cannot run) for every kernel variant."""
    from salactl.runtime.ops.w4a16.layout import pack_tc
    from salactl.runtime.ops.w4a16.tc_config import TCConfig
    from salactl.runtime.ops.w4a16.triton_tc import w4a16_tc, w4a16_tc_dequantize

    parts = cfg.split()
    gen = torch.Generator().manual_seed(3)
    K, N, G = 1024, 384, 128
    q = torch.randint(0, 16, (K, N), generator=gen)
    s = (torch.rand(K // G, N, generator=gen) * 0.01 + 0.001).half()
    w = ((q.float() - 8) * s.float()[torch.arange(K) // G]).t()
    for M in (1, 8, 32, 70):
        x = torch.randn(M, K, generator=gen).to(dt)
        ref = x.float() @ w.t()
        st = [int(p[2:]) for p in parts if p.startswith("st")]
        c = TCConfig(int(parts[0][2:]), 16 if M <= 16 else 32 if M <= 32 else 64, 3, int(parts[1][1:]),
                     st[0] if st else 1, "bias" in parts, 4 if "un4" in parts else 2 if "un2" in parts else 1,
                     2 if "pf2" in parts else 1 if "pf" in parts else 0,
                     int(parts[-1][3:]) if parts[-1].startswith("red") else 1,
                     2 if "tma2" in parts else 1 if "tma1" in parts else 0, 2 if "tkb2" in parts else 1,
                     -1 if "ewall" in parts else int("ew" in parts))
        for _ in range(2):
            y = w4a16_tc(x.cuda(), pack_tc(q).cuda(), s.cuda(), G, c).cpu()
            assert rel_err(y.float(), ref) < 5e-3, (cfg, M)
    wd = w4a16_tc_dequantize(pack_tc(q).cuda(), s.cuda(), G, dt).float().cpu()
    assert bool(((wd - w).abs() <= w.abs() * 2 ** -7 + 1e-7).all())


@gpu
@needs_triton
@pytest.mark.parametrize("spec", ["bn=64,w=4,tma=1,stages=4", "bn=128,w=4,tma=2,stages=6,red=4",
                                  "bn=128,w=8,tma=1,stages=3,bias=1", "bn=64,w=4,tma=2,tkb=2,stages=3",
                                  # every word of the split prefetched into L2 first: 10 blocks at split 1
                                  # are three 128-line prefetch steps, the last one partly masked
                                  "bn=64,w=4,tma=1,stages=3,ew=-1", "bn=64,w=4,un=2,ew=-1"])
@pytest.mark.parametrize("G", [128, 256, -1])
def test_tma_kernel_on_cuda_with_ragged_n_and_split_k(spec, G):
    """The TMA variant where N is not a multiple of BLOCK_N (the last tile's extra rows read the next
    block's words or TMA's zero fill and are masked at the store), with split-K and an uneven tail."""
    from salactl.runtime.ops.w4a16.layout import pack_tc
    from salactl.runtime.ops.w4a16.tc_config import tc_config_from_spec
    from salactl.runtime.ops.w4a16.triton_tc import w4a16_tc

    gen = torch.Generator().manual_seed(5)
    K, N = 1280, 336                          # 10 K blocks; 336 = 21 row groups
    group = K if G == -1 else G
    q = torch.randint(0, 16, (K, N), generator=gen)
    s = (torch.rand(K // group, N, generator=gen) * 0.01 + 0.001).half()
    w = ((q.float() - 8) * s.float()[torch.arange(K) // group]).t()
    for M, split in ((1, 4), (5, 1), (16, 3)):     # split 4: 3+3+3+1 blocks (pairs: 4+4+2+0)
        x = torch.randn(M, K, generator=gen).bfloat16()
        cfg = tc_config_from_spec(f"{spec},split={split}", M, N, K)
        for _ in range(2):
            y = w4a16_tc(x.cuda(), pack_tc(q).cuda(), s.cuda(), G, cfg).cpu()
            assert rel_err(y.float(), x.float() @ w.t()) < 5e-3, (spec, M, split)


_INTERPRETED_GLU_CHECK = textwrap.dedent("""
    import torch
    from salactl.runtime.ops.fused.triton import silu_mul
    from salactl.runtime.ops.w4a16.layout import pack_tc
    from salactl.runtime.ops.w4a16.tc_config import TCConfig, glu_epilogue_ok
    from salactl.runtime.ops.w4a16.triton import w4a16_glu, w4a16_linear
    from salactl.runtime.ops.w4a16.triton_tc import w4a16_tc
    gen = torch.Generator().manual_seed(11)
    K, N = 768, 256                      # [gate | up], 128 rows each: 2 tiles at BLOCK_N 128, 4 at 64
    cases = [(128, 1, TCConfig(64, 16, 1, num_stages=3, tma=1)),
             (128, 5, TCConfig(128, 16, 2, num_stages=3, reduce=2, tma=1)),       # split-K, last split's epilogue
             (256, 3, TCConfig(64, 16, 3, num_stages=2, tma=2, tma_blocks=2)),    # pairs, a group row per pair
             (-1, 17, TCConfig(128, 16, 2, num_stages=3, tma=1, tma_blocks=2)),  # two M tiles, one group
             (128, 2, TCConfig(64, 16, 1, num_stages=3, tma=1, early=True))]     # early is dropped
    for G, M, cfg in cases:
        assert glu_epilogue_ok(cfg, N, K, G)
        ng = 1 if G == -1 else K // G
        q = torch.randint(0, 16, (K, N), generator=gen)
        s = (torch.rand(ng, N, generator=gen) * 0.01 + 0.001).half()
        x = torch.randn(M, K, generator=gen).bfloat16()
        unfused = silu_mul(w4a16_tc(x, pack_tc(q), s, G, cfg))
        for _ in range(2):                 # the second call checks the split-K counter reset
            y = w4a16_tc(x, pack_tc(q), s, G, cfg, glu=True)
            assert y.shape == (M, N // 2) and torch.equal(y, unfused), (G, M, cfg)
    # not fusable (register kernel, groups of 64, tiles straddling the halves): the dispatch falls back
    assert not glu_epilogue_ok(TCConfig(64, 16, 1), N, K, 128)
    assert not glu_epilogue_ok(TCConfig(64, 16, 1, tma=1), N, K, 64)
    assert not glu_epilogue_ok(TCConfig(128, 16, 1, tma=1), 192, K, 128)
    q = torch.randint(0, 16, (K, N), generator=gen)
    s = (torch.rand(K // 64, N, generator=gen) * 0.01 + 0.001).half()
    x = torch.randn(3, K, generator=gen).bfloat16()
    w = ((q.float() - 8) * s.float()[torch.arange(K) // 64]).t()
    gu = (x.float() @ w.t()).bfloat16().float()
    want = torch.nn.functional.silu(gu[:, :N // 2]).bfloat16().float() * gu[:, N // 2:]
    got = w4a16_glu(x, pack_tc(q), s, 64)
    assert torch.equal(got, silu_mul(w4a16_linear(x, pack_tc(q), s, 64)))
    # groups of 64 scale bf16 weights before the MMA (GEMM rel err ~6e-3), which silu·mul compounds
    assert float((got.float() - want).norm() / want.norm()) < 3e-2
    print("ok")
""")


@needs_triton
@interpreted
def test_silu_mul_epilogue_matches_the_separate_kernel_in_the_interpreter():
    """w4a16_tc(glu=True) stores silu(gate)·up bit for bit as the GEMM then the silu_mul kernel."""
    _run_interpreted(_INTERPRETED_GLU_CHECK)


@gpu
@needs_triton
@pytest.mark.parametrize("spec", ["bn=128,w=4,tma=1,tkb=2,stages=4", "bn=64,w=4,tma=1,tkb=2,stages=3",
                                  "bn=128,w=4,tma=1,stages=4,red=4", "bn=64,w=4,tma=2,stages=3,bias=1"])
@pytest.mark.parametrize("G", [128, -1])
def test_silu_mul_epilogue_on_cuda(spec, G):
    """The GLU epilogue on the GPU (inline-PTX dequantization, 4-D word boxes, split-K) against the
    GEMM then the silu_mul kernel (bit for bit) and the fp32 reference; the dispatch at 9B's shape."""
    from salactl.runtime.ops.fused.triton import silu_mul
    from salactl.runtime.ops.w4a16.layout import pack_tc
    from salactl.runtime.ops.w4a16.tc_config import tc_config_from_spec
    from salactl.runtime.ops.w4a16.triton import w4a16_glu
    from salactl.runtime.ops.w4a16.triton_tc import w4a16_tc

    gen = torch.Generator().manual_seed(9)
    K, N = 1024, 768
    group = K if G == -1 else G
    q = torch.randint(0, 16, (K, N), generator=gen)
    s = (torch.rand(K // group, N, generator=gen) * 0.01 + 0.001).half()
    w = ((q.float() - 8) * s.float()[torch.arange(K) // group]).t()
    qw, sc = pack_tc(q).cuda(), s.cuda()
    for M, split in ((1, 1), (1, 4), (8, 2), (32, 1)):
        x = torch.randn(M, K, generator=gen).bfloat16().cuda()
        cfg = tc_config_from_spec(f"{spec},split={split}", M, N, K)
        unfused = silu_mul(w4a16_tc(x, qw, sc, G, cfg))
        for _ in range(2):
            y = w4a16_tc(x, qw, sc, G, cfg, glu=True)
            assert torch.equal(y, unfused), (spec, M, split)
        gu = x.float().cpu() @ w.t()
        want = torch.nn.functional.silu(gu[:, :N // 2]) * gu[:, N // 2:]
        assert rel_err(y.float().cpu(), want) < 1e-2
    # the engine's gate/up at 9B shapes through the dispatch (TMA, split 1 at M = 1 and 8)
    K, N = 4096, 32768
    q = torch.randint(0, 16, (K, N), generator=gen)
    s = (torch.rand(K // 128, N, generator=gen) * 0.01 + 0.001).half()
    qw, sc = pack_tc(q).cuda(), s.cuda()
    for M in (1, 8, 32):
        x = torch.randn(M, K, generator=gen).bfloat16().cuda()
        assert torch.equal(w4a16_glu(x, qw, sc, 128), silu_mul(w4a16_tc(x, qw, sc, 128))), M

"""GPU-engine kernels against their plain-PyTorch references on the GPU (real 9B head shapes,
bf16 and fp32). Skipped without CUDA; CPU coverage is in test_gpu_interpret.py."""

import pytest
import torch

from conftest import gpu

pytestmark = [pytest.mark.gpu, gpu]


def _assert_rows(rows):
    bad = [r for r in rows if not r[1] <= r[2]]
    assert not bad, bad


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_gla_decode_and_prefill(dtype):
    from salactl.runtime.gpu import selfcheck as S
    _assert_rows(S.check_gla("cuda", dtype))


def test_gla_prefill_runs_fla_core_on_cuda():
    """Without fla-core the prefill rows above compare the reference with itself, so this says
    whether they tested fla's kernel (a skip here means they did not)."""
    pytest.importorskip("fla.ops.simple_gla", reason="fla-core (the gpu extra) is not installed")
    from salactl.runtime.gpu import selfcheck as S
    from salactl.runtime.ops.gla.triton import FLA

    rows = S.check_gla("cuda", torch.float32, T=70)
    _assert_rows(rows)
    assert any(name.startswith(f"gla_prefill[{FLA}]") for name, *_ in rows), rows


@pytest.mark.parametrize("fp8", [None, torch.float8_e4m3fn, torch.float8_e5m2])
def test_store_kv(fp8):
    from salactl.runtime.gpu import selfcheck as S
    _assert_rows(S.check_store_kv("cuda", torch.bfloat16, fp8=fp8))


@pytest.mark.parametrize("dtype,fp8", [(torch.bfloat16, False), (torch.float32, False), (torch.bfloat16, True)])
def test_paged_decode_attention(dtype, fp8):
    from salactl.runtime.gpu import selfcheck as S
    _assert_rows(S.check_decode_attention("cuda", dtype, fp8=fp8))


@pytest.mark.parametrize("fp8", [False, True])
def test_paged_decode_attention_every_config(fp8):
    """Every default and every swept launch config of benchmarks/decode_attention_bench.py, bf16
    and fp8 pages (fp32 pages: the defaults only, above; 4-page fp32 tiles exceed shared memory)."""
    from salactl.runtime.gpu import selfcheck as S
    from salactl.runtime.ops.decode_attention.config import DEFAULT_CONFIGS, SWEEP_CONFIGS
    for cfg in dict.fromkeys([*DEFAULT_CONFIGS.values(), *SWEEP_CONFIGS]):
        _assert_rows(S.check_decode_attention("cuda", torch.bfloat16, fp8=fp8, config=cfg))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_selection(dtype):
    from salactl.runtime.gpu import selfcheck as S
    _assert_rows(S.check_selection("cuda", dtype))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("ties", [False, True])
@pytest.mark.parametrize("knobs", [{}, dict(rank_short_rows=64),
                                   dict(gather_chunk=256, num_warps=4, short_blocks=0),
                                   dict(nbc=32, gather_chunk=2048, num_warps=16, short_blocks=0, rank_rb=16),
                                   dict(dedup=False), dict(rank_rb=8, rank_ct=512, rank_warps=4, rank_short_rows=64),
                                   dict(p2_early=False), dict(p2_early=False, num_warps=2), dict(nbc=16, lse_splits=128),
                                   dict(lse_elem=False, lse_stages=3)])
def test_decode_selection_exact_set_and_order(dtype, ties, knobs):
    """select_decode at 9B shapes vs reference.select_blocks (set and order; near-ties only):
    default knobs (10 rows: short rows radix-selected), short rows ranked, every row gathered and
    ranked (one and several gather programs per row), other pass-2 / rank launch shapes, pass 2
    with its K1 scores after the PDL wait (p2_early=False; the default computes them before it),
    the lse pass reducing per row at each step (lse_elem=False)."""
    from salactl.runtime.gpu import selfcheck as S
    from salactl.runtime.ops.selection.check import check_decode_selection

    sh = S.Shapes()
    sc = sh.sparse
    lens = [sc.dense_len, sc.dense_len + 1, sc.dense_len + 37, 20 * sh.block - 1, 50001]
    _assert_rows(check_decode_selection("cuda", dtype, sh.hq, sh.hkv, sh.d, sc, lens, ties=ties, **knobs))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_fused_ops(dtype):
    from salactl.runtime.gpu import selfcheck as S
    _assert_rows(S.check_fused("cuda", dtype))


@pytest.mark.parametrize("shape", [(4096, 4096), (8704, 4096), (4096, 16384), (100, 700)])
def test_batch1_gemv(shape):
    """The batch-1 bf16 GEMV, every candidate block shape, against an fp32 matmul."""
    from salactl.runtime.ops.gemv import triton as gv

    n, k = shape
    g = torch.Generator(device="cuda").manual_seed(0)
    w = torch.randn(n, k, device="cuda", generator=g).bfloat16()
    x = torch.randn(1, k, device="cuda", generator=g).bfloat16()
    ref = x.float() @ w.float().t()
    for cfg in gv.CANDIDATE_CONFIGS:
        y = gv.gemv(x, w, cfg).float()
        assert ((y - ref).norm() / ref.norm()).item() < 1e-2, cfg


@pytest.mark.parametrize("shape", [(4096, 4096), (8704, 4096), (100, 700)])
def test_skinny_gemm(shape):
    """The skinny bf16 GEMM, every candidate block shape, 2-64 rows, against an fp32 matmul."""
    from salactl.runtime.ops.gemv import skinny

    n, k = shape
    g = torch.Generator(device="cuda").manual_seed(0)
    w = torch.randn(n, k, device="cuda", generator=g).bfloat16()
    for m in (2, 8, 17, 32, 64):
        x = torch.randn(m, k, device="cuda", generator=g).bfloat16()
        ref = x.float() @ w.float().t()
        for cfg in skinny.CANDIDATE_CONFIGS:
            y = skinny.skinny_linear(x, w, cfg).float()
            assert ((y - ref).norm() / ref.norm()).item() < 1e-2, (m, cfg)


def test_w4a16_mlp_silu_mul_epilogue_in_the_fused_model(monkeypatch):
    """The fused MLP at 9B shapes with W4A16 weights: gate/up's GEMM storing silu(gate)·up equals the
    separate silu_mul kernel bit for bit (SALACTL_W4A16_GLU=0) and the plain MLP to bf16 noise."""
    import contextlib

    from salactl.quant.linear import GPTQLinear
    from salactl.quant.packing import pack_qweight
    from salactl.runtime.gpu.fast_model import FusedMLP, _concat
    from salactl.runtime.layers.mlp import MLP

    g = torch.Generator().manual_seed(1)
    hidden, inter = 4096, 16384
    mlp = MLP(hidden, inter)
    for name, (k, n) in (("gate_proj", (hidden, inter)), ("up_proj", (hidden, inter)), ("down_proj", (inter, hidden))):
        codes = torch.randint(0, 16, (k, n), generator=g, dtype=torch.int32)
        scales = torch.rand(k // 128, n, generator=g) * 2e-3 + 1e-4
        setattr(mlp, name, GPTQLinear.from_gptq(pack_qweight(codes, 4), scales, None, 4, 128, "cuda", torch.bfloat16))
    timer = lambda name: contextlib.nullcontext()   # noqa: E731
    xs = [torch.randn(m, hidden, device="cuda").bfloat16() for m in (1, 8, 32)]
    plain = [mlp(x, timer) for x in xs]
    mlp.__class__ = FusedMLP
    mlp._w_gate_up = _concat([mlp.gate_proj, mlp.up_proj])
    fused = [mlp(x, timer) for x in xs]
    monkeypatch.setenv("SALACTL_W4A16_GLU", "0")
    separate = [mlp(x, timer) for x in xs]
    for x, a, b, c in zip(xs, plain, fused, separate):
        assert torch.equal(b, c), x.shape
        assert ((b.float() - a.float()).norm() / a.float().norm()).item() < 1e-2, x.shape


def test_fused_w4a16_projection_on_gpu():
    """W4A16 projections concatenated along N (the engine's fusion) equal the separate modules."""
    from salactl.quant.linear import GPTQLinear
    from salactl.quant.packing import pack_qweight
    from salactl.runtime.gpu.fast_model import _concat

    g = torch.Generator().manual_seed(0)
    K = 512
    mods = []
    for n in (256, 64, 128):
        codes = torch.randint(0, 16, (K, n), generator=g, dtype=torch.int32)
        scales = torch.rand(K // 128, n, generator=g) * 0.01 + 0.001
        mods.append(GPTQLinear.from_gptq(pack_qweight(codes, 4), scales, None, 4, 128, "cuda", torch.bfloat16))
    assert all(m.layout == "triton" for m in mods)
    for rows in (1, 8, 40):
        x = torch.randn(rows, K, device="cuda").bfloat16()
        before = torch.cat([m(x).float() for m in mods], dim=-1)
        fused = _concat(mods)
        y = fused(x).float()
        assert ((y - before).norm() / before.norm()).item() < 1e-2

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


@pytest.mark.parametrize("fp8", [None, torch.float8_e4m3fn, torch.float8_e5m2])
def test_store_kv(fp8):
    from salactl.runtime.gpu import selfcheck as S
    _assert_rows(S.check_store_kv("cuda", torch.bfloat16, fp8=fp8))


@pytest.mark.parametrize("dtype,fp8", [(torch.bfloat16, False), (torch.float32, False), (torch.bfloat16, True)])
def test_paged_decode_attention(dtype, fp8):
    from salactl.runtime.gpu import selfcheck as S
    _assert_rows(S.check_decode_attention("cuda", dtype, fp8=fp8))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_selection(dtype):
    from salactl.runtime.gpu import selfcheck as S
    _assert_rows(S.check_selection("cuda", dtype))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("ties", [False, True])
@pytest.mark.parametrize("knobs", [{}, dict(nbc=32, group=128, tile=256, radix_bits=4, num_warps=4)])
def test_decode_selection_exact_set_and_order(dtype, ties, knobs):
    """select_decode at 9B shapes vs reference.select_blocks (set and order; near-ties only)."""
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

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
def test_fused_ops(dtype):
    from salactl.runtime.gpu import selfcheck as S
    _assert_rows(S.check_fused("cuda", dtype))

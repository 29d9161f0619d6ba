"""Our Triton W8A16 kernel against the plain GPTQ reference: through the Triton interpreter on
CPU-only machines (in a subprocess: TRITON_INTERPRET must be set before triton compiles), and on CUDA."""

import pytest
import torch

from conftest import gpu, rel_err
from test_w4a16_triton import _run_interpreted, interpreted, needs_triton

_CHECK = """
import torch
from salactl.quant.linear import W4A16Linear
from salactl.quant.packing import default_g_idx, to_gptq_tensors
from salactl.runtime.ops.w4a16 import reference
from salactl.runtime.ops.w8a16.triton import DEFAULT, DEFAULT_GEMV, W8Config, w8a16_linear

def check(K, N, G, M, dtype, sms, device):
    gen = torch.Generator().manual_seed(K + N + M)
    codes = torch.randint(0, 256, (N, K), generator=gen)
    scales = (torch.rand(1 if G == -1 else K // G, N, generator=gen) * 0.01 + 0.001).half()
    t = to_gptq_tensors(codes, scales, default_g_idx(K, G), 8)
    mod = W4A16Linear.from_gptq(t["qweight"], t["scales"], t["g_idx"], 8, G, "cpu", torch.bfloat16)
    qweight = mod.qweight.to(device)              # the int8 layout [groups, N, group], codes - 128
    x = torch.randn(M, K, generator=gen).to(dtype)
    ref = reference.w4a16_matmul(x.float(), t["qweight"], t["scales"], t["g_idx"], 8)
    splits = set()
    for cfg in (None, W8Config(gemv=0)):         # the dispatch's kernel; one row on tensor cores too
        for _ in range(2):                        # the second call checks the split-K tickets were reset
            y = w8a16_linear(x.to(device), qweight, scales.to(device), sms, cfg)
            assert y.dtype == dtype and y.shape == (M, N)
            err = float((y.float().cpu() - ref).norm() / ref.norm())
            assert err < 5e-3, (K, N, G, M, dtype, sms, cfg, err)
        splits.add((cfg or (DEFAULT_GEMV if M == 1 else DEFAULT)).split(N, K, K if G == -1 else G, sms))
    return splits

def run(device, cases):
    splits = set().union(*(check(*c, device) for c in cases))
    assert 1 in splits and max(splits) > 2, splits     # unsplit and split-K launches both checked
    print("ok")

"""

# K, N, group, rows, dtype, SMs (the split count follows from N and the SMs)
_CPU_CASES = [(256, 256, 128, 1, torch.bfloat16, 1), (256, 64, 64, 5, torch.float16, 8),
              (384, 48, 32, 3, torch.bfloat16, 4), (512, 80, -1, 17, torch.bfloat16, 2),
              (512, 64, 128, 1, torch.float16, 4)]
_GPU_CASES = [(4096, 4096, 128, 1, torch.bfloat16, 132), (4096, 4096, 128, 8, torch.float16, 132),
              (4096, 16384, 128, 1, torch.bfloat16, 132), (1024, 320, 32, 33, torch.bfloat16, 132),
              (2048, 192, -1, 64, torch.bfloat16, 132), (1024, 8192, 64, 2, torch.float16, 1)]


@needs_triton
@interpreted
def test_w8a16_kernel_matches_reference_in_the_interpreter():
    _run_interpreted(_CHECK + f"\nrun('cpu', {_CPU_CASES!r})\n")


@gpu
@needs_triton
def test_w8a16_kernel_on_cuda():
    namespace: dict = {}
    exec(_CHECK, namespace)
    namespace["run"]("cuda", _GPU_CASES)


@gpu
@needs_triton
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_w8a16_linear_on_cuda_kernel_and_dequantized_paths(dtype):
    """Up to 64 rows the kernel (float32 models: bf16 activations), from 65 the dequantized weight."""
    from salactl.quant.linear import W4A16Linear
    from salactl.quant.packing import default_g_idx, to_gptq_tensors
    from salactl.runtime.ops.w4a16 import reference

    gen = torch.Generator().manual_seed(0)
    K, N = 1024, 256
    codes = torch.randint(0, 256, (N, K), generator=gen)
    scales = (torch.rand(K // 128, N, generator=gen) * 0.01 + 0.001).half()
    t = to_gptq_tensors(codes, scales, default_g_idx(K, 128), 8)
    mod = W4A16Linear.from_gptq(t["qweight"], t["scales"], t["g_idx"], 8, 128, "cuda", dtype)
    for rows in (1, 64, 65):
        x = torch.randn(rows, K, generator=gen).to(dtype)
        y = mod(x.cuda())
        ref = reference.w4a16_matmul(x.float(), t["qweight"], t["scales"], t["g_idx"], 8)
        assert y.dtype == dtype and rel_err(y.float().cpu(), ref) < 1e-2

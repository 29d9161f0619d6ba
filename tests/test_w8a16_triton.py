"""Our Triton W8A16 kernels against the plain GPTQ reference: through the Triton interpreter on
CPU-only machines (in a subprocess: TRITON_INTERPRET must be set before triton compiles), and on CUDA.
triton.py: the int8-layout kernels (CPU layout; CUDA where the tensor-core layout does not fit);
triton_tc.py: the tensor-core kernel on the pack_tc8 layout."""

import pytest
import torch

from conftest import gpu, rel_err
from test_w4a16_triton import _run_interpreted, interpreted, needs_triton

_CHECK = """
import torch
from salactl.quant.linear import GPTQLinear
from salactl.quant.packing import default_g_idx, to_gptq_tensors
from salactl.runtime.ops.w4a16 import reference
from salactl.runtime.ops.w8a16.triton import DEFAULT, DEFAULT_GEMV, W8Config, w8a16_linear

def check(K, N, G, M, dtype, sms, device):
    gen = torch.Generator().manual_seed(K + N + M)
    codes = torch.randint(0, 256, (N, K), generator=gen)
    scales = (torch.rand(1 if G == -1 else K // G, N, generator=gen) * 0.01 + 0.001).half()
    t = to_gptq_tensors(codes, scales, default_g_idx(K, G), 8)
    mod = GPTQLinear.from_gptq(t["qweight"], t["scales"], t["g_idx"], 8, G, "cpu", torch.bfloat16)
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
    from salactl.quant.linear import GPTQLinear
    from salactl.quant.packing import default_g_idx, to_gptq_tensors
    from salactl.runtime.ops.w4a16 import reference

    gen = torch.Generator().manual_seed(0)
    K, N = 1024, 256
    codes = torch.randint(0, 256, (N, K), generator=gen)
    scales = (torch.rand(K // 128, N, generator=gen) * 0.01 + 0.001).half()
    t = to_gptq_tensors(codes, scales, default_g_idx(K, 128), 8)
    mod = GPTQLinear.from_gptq(t["qweight"], t["scales"], t["g_idx"], 8, 128, "cuda", dtype)
    for rows in (1, 64, 65):
        x = torch.randn(rows, K, generator=gen).to(dtype)
        y = mod(x.cuda())
        ref = reference.w4a16_matmul(x.float(), t["qweight"], t["scales"], t["g_idx"], 8)
        assert y.dtype == dtype and rel_err(y.float().cpu(), ref) < 1e-2


_TC8_CHECK = """
import torch
from salactl.runtime.ops.w8a16.layout import pack_tc8
from salactl.runtime.ops.w8a16.triton_tc import TC8Config, default_tc8_config, w8a16_tc, w8a16_tc_dequantize

def check(K, N, G, M, dtype, sms, cfg, device):
    gen = torch.Generator().manual_seed(K + N + M)
    u = torch.randint(0, 256, (K, N), generator=gen)
    g = K if G == -1 else G
    s = (torch.rand(K // g, N, generator=gen) * 0.01 + 0.001).half()
    w = (u - 128).float() * s.float().repeat_interleave(g, 0)                   # [K, N], by definition
    x = torch.randn(M, K, generator=gen).to(dtype)
    ref = x.float() @ w
    words, s_dev = pack_tc8(u).to(device), s.to(device)
    cfg = TC8Config(**cfg) if cfg else default_tc8_config(M, N, K)
    for _ in range(2):                        # the second call checks the split-K tickets were reset
        y = w8a16_tc(x.to(device), words, s_dev, G, cfg, sms)
        assert y.dtype == dtype and y.shape == (M, N)
        err = float((y.float().cpu() - ref).norm() / ref.norm())
        assert err < 5e-3, (K, N, G, M, dtype, sms, cfg, err)
    wd = w8a16_tc_dequantize(words, s_dev, G, dtype).float().cpu()
    assert float((wd - w.t()).abs().max() / w.abs().max()) < 1e-2, (K, N, G, dtype)   # one bf16 ulp
    return cfg.split(M, N, K, sms)

def run(device, cases):
    splits = {check(*c, device) for c in cases}
    assert 1 in splits and max(splits) > 2, splits     # unsplit and split-K launches both checked
    print("ok")

"""

# K, N, group, rows, dtype, SMs, TC8Config fields (None: the dispatch's config). N = 48: one tile of BLOCK_N 32 with a
# masked row group; K = 448: 7 blocks, so unroll 4 and 2 have masked tails and splits are uneven.
_TC8_CPU_CASES = [(256, 64, 128, 1, torch.bfloat16, 1, dict(waves=0.25)), (448, 48, 64, 5, torch.float16, 8, None),
                  (448, 48, 64, 5, torch.bfloat16, 8, dict(f16=1)), (256, 64, -1, 17, torch.float16, 2, dict(f16=1)),
                  (448, 64, -1, 20, torch.bfloat16, 4, dict(unroll=2, red=2)),
                  (448, 32, 64, 3, torch.bfloat16, 64, dict(unroll=4, block_n=32, warps=2)),
                  (256, 80, 128, 40, torch.bfloat16, 2, None), (192, 16, -1, 2, torch.float16, 16, dict(unroll=1))]
_TC8_GPU_CASES = [(4096, 4096, 128, 1, torch.bfloat16, 132, None), (4096, 4096, 128, 8, torch.float16, 132, None),
                  (4096, 16384, 128, 1, torch.bfloat16, 132, None), (16384, 4096, 128, 16, torch.bfloat16, 132, None),
                  (4096, 8704, 128, 32, torch.bfloat16, 132, None), (1024, 320, 64, 33, torch.bfloat16, 132, None),
                  (2048, 192, -1, 64, torch.bfloat16, 132, None), (1024, 8192, 64, 2, torch.float16, 1, None),
                  (448, 48, 64, 5, torch.bfloat16, 132, dict(unroll=4, stages=3, block_n=32, warps=2)),
                  (4096, 4096, 128, 24, torch.bfloat16, 132, dict(unroll=1, stages=3, red=4))]


def test_tc8_layout_round_trip_and_word_order(rng):
    from salactl.runtime.ops.w8a16.layout import pack_tc8, unpack_tc8

    u = torch.randint(0, 256, (128, 32), generator=rng)
    w = pack_tc8(u)
    assert w.shape == (2, 2, 256) and w.dtype == torch.int32 and torch.equal(unpack_tc8(w), u.to(torch.int32))
    # block kb=1, row group g=1, n8=1, nlo=3 (row 16 + 8 + 3 = 27), c=2, tile t=3: word 128 + 48 + 8 + 3;
    # byte half8 + 2·pair holds k = 64 + 48 + 8·half8 + 4 + pair
    word = int(w[1, 1, 128 + 3 * 16 + 2 * 4 + 3]) & 0xFFFFFFFF
    for half8 in (0, 1):
        for pair in (0, 1):
            assert (word >> (8 * (half8 + 2 * pair))) & 0xFF == int(u[64 + 48 + 8 * half8 + 4 + pair, 27])


def test_tc8_layout_rejects_bad_shapes():
    from salactl.errors import QuantizationError
    from salactl.runtime.ops.w8a16.layout import pack_tc8

    with pytest.raises(QuantizationError, match="in_features % 64"):
        pack_tc8(torch.zeros(96, 16, dtype=torch.int32))
    with pytest.raises(QuantizationError, match="out_features % 16"):
        pack_tc8(torch.zeros(128, 24, dtype=torch.int32))


@needs_triton
@interpreted
def test_w8a16_tensor_core_kernel_matches_reference_in_the_interpreter():
    _run_interpreted(_TC8_CHECK + f"\nrun('cpu', {_TC8_CPU_CASES!r})\n")


@gpu
@needs_triton
def test_w8a16_tensor_core_kernel_on_cuda():
    namespace: dict = {}
    exec(_TC8_CHECK, namespace)
    namespace["run"]("cuda", _TC8_GPU_CASES)

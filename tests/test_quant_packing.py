import pytest
import torch

from conftest import gpu, rel_err
from salactl.errors import QuantizationError
from salactl.quant.linear import GPTQLinear
from salactl.quant.packing import (default_g_idx, num_groups, pack_qweight, pack_qzeros, symmetric_qzeros_word,
                                   to_gptq_tensors, unpack_qweight, unpack_qzeros)
from salactl.runtime.ops.w4a16 import reference


@pytest.mark.parametrize("bits", [4, 8])
def test_qweight_round_trip_and_bit_layout(bits, rng):
    K, N = 64, 24
    q = torch.randint(0, 2 ** bits, (K, N), generator=rng)
    packed = pack_qweight(q, bits)
    assert packed.dtype == torch.int32 and packed.shape == (K * bits // 32, N)
    assert torch.equal(unpack_qweight(packed, bits), q.to(torch.int32))
    # GPTQ v1: value k = v*r + j sits in bits [bits*j, bits*j + bits) of word row r, low bits first
    v = 32 // bits
    word = int(packed[1, 3]) & 0xFFFFFFFF
    assert [(word >> (bits * j)) & (2 ** bits - 1) for j in range(v)] == q[v:2 * v, 3].tolist()


@pytest.mark.parametrize("bits,fmt", [(4, "gptq"), (4, "gptq_v2"), (8, "gptq"), (8, "gptq_v2")])
def test_qzeros_round_trip_and_symmetric_word(bits, fmt, rng):
    z = torch.randint(1, 2 ** bits, (3, 16), generator=rng)
    assert torch.equal(unpack_qzeros(pack_qzeros(z, bits, fmt), bits, fmt), z.to(torch.int32))
    sym = torch.full((2, 16), 2 ** (bits - 1))
    words = pack_qzeros(sym, bits, fmt)
    assert bool((words == symmetric_qzeros_word(bits, fmt)).all())
    expected = {(4, "gptq"): 0x77777777, (4, "gptq_v2"): 0x88888888, (8, "gptq"): 0x7F7F7F7F,
                (8, "gptq_v2"): 0x80808080}[(bits, fmt)]
    assert int(words[0, 0]) & 0xFFFFFFFF == expected


def test_pack_rejects_out_of_range_and_bad_bits():
    with pytest.raises(QuantizationError):
        pack_qweight(torch.full((8, 2), 16), 4)
    with pytest.raises(QuantizationError):
        pack_qweight(torch.zeros(8, 2), 3)
    # one bad value among good ones, at either end of the range, in either tensor
    for bits in (4, 8):
        for bad in (-1, 2 ** bits):
            q = torch.arange(16).remainder(2 ** bits).view(8, 2)
            q[5, 1] = bad
            with pytest.raises(QuantizationError, match="cannot be packed"):
                pack_qweight(q, bits)
            with pytest.raises(QuantizationError, match="cannot be packed"):
                pack_qzeros(q.t(), bits, "gptq_v2")        # v2 stores the zero points as they are


def test_group_counts_and_indices():
    assert [num_groups(256, g) for g in (-1, 128, 32, 100)] == [1, 2, 8, 3]
    assert default_g_idx(8, -1).tolist() == [0] * 8
    assert default_g_idx(8, 3).tolist() == [0, 0, 0, 1, 1, 1, 2, 2]


def _random_gptq(K, N, G, bits, rng):
    codes = torch.randint(0, 2 ** bits, (N, K), generator=rng)
    ng = 1 if G == -1 else K // G
    scales = (torch.rand(ng, N, generator=rng) * 0.02 + 0.001).half()
    return codes, scales, to_gptq_tensors(codes, scales, default_g_idx(K, G), bits)


@pytest.mark.parametrize("bits,G", [(4, 128), (4, 32), (4, -1), (8, 64)])
def test_dequant_matmul_equivalence(bits, G, rng):
    K, N = 256, 64
    codes, scales, t = _random_gptq(K, N, G, bits, rng)
    g = default_g_idx(K, G).long()
    w = scales.float()[g].t() * (codes.float() - 2 ** (bits - 1))             # [N, K], by definition
    assert torch.equal(reference.dequantize(t["qweight"], t["scales"], t["g_idx"], bits,
                                            t["qzeros"], "gptq"), w)
    x = torch.randn(5, K, generator=rng)
    y = reference.w4a16_matmul(x, t["qweight"], t["scales"], t["g_idx"], bits, t["qzeros"])
    assert rel_err(y, x @ w.t()) < 1e-6


@pytest.mark.parametrize("dtype,G,bits,layout", [
    (torch.float32, 128, 4, "cpu_int4"), (torch.float32, -1, 4, "cpu_int4"), (torch.float16, 64, 4, "cpu_int4"),
    (torch.bfloat16, 128, 4, "cpu_int4"), (torch.bfloat16, 32, 4, "cpu_int4"), (torch.bfloat16, -1, 4, "cpu_int4"),
    (torch.float32, 128, 8, "int8"), (torch.bfloat16, 64, 8, "int8"), (torch.float16, -1, 8, "int8"),
    (torch.float32, 16, 4, "dequant")])
@pytest.mark.parametrize("rows", [1, 21])       # int8: one op per group / dequantized once
def test_w4a16_linear_cpu_layouts_match_reference(dtype, G, bits, layout, rows, rng):
    K, N = 256, 128
    codes, scales, t = _random_gptq(K, N, G, bits, rng)
    mod = GPTQLinear.from_gptq(t["qweight"], t["scales"], t["g_idx"], bits, G, "cpu", dtype)
    assert mod.layout == layout and mod.in_features == K and mod.out_features == N
    x = torch.randn(rows, 1, K, generator=rng).to(dtype)
    ref = reference.w4a16_matmul(x.float(), t["qweight"], t["scales"], t["g_idx"], bits)
    y = mod(x)
    assert y.shape == (rows, 1, N) and y.dtype == dtype
    exact = layout == "dequant"          # cpu_int4 / int8: bf16 activations and scales
    assert rel_err(y.float(), ref) < (1e-6 if exact else 1e-2)
    assert rel_err(mod.dequantized_weight(), reference.dequantize(t["qweight"], t["scales"], t["g_idx"], bits)) \
        < (1e-6 if exact else 4e-3)
    # packed bytes are buffers, so the roofline counts them
    nbytes = sum(b.numel() * b.element_size() for b in mod.buffers())
    assert K * N * bits // 8 <= nbytes < K * N * 2


def test_w4a16_linear_act_order_g_idx_is_repacked(rng):
    K, N, G = 256, 64, 64
    codes, scales, _ = _random_gptq(K, N, G, 4, rng)
    perm = torch.randperm(K, generator=rng)
    g_idx = torch.empty(K, dtype=torch.int32)
    g_idx[perm] = torch.arange(K, dtype=torch.int32) // G           # act-order without static groups
    t = to_gptq_tensors(codes, scales, g_idx, 4)
    mod = GPTQLinear.from_gptq(t["qweight"], t["scales"], t["g_idx"], 4, G, "cpu", torch.float32)
    x = torch.randn(4, K, generator=rng)
    ref = reference.w4a16_matmul(x, t["qweight"], t["scales"], t["g_idx"], 4)
    assert mod.perm is not None and rel_err(mod(x), ref) < 1e-2       # cpu_int4: bf16 activations


@gpu
@pytest.mark.parametrize("G,layout", [(128, "triton8"), (-1, "triton8"), (32, "int8")])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_w8a16_linear_on_cuda_matches_reference(G, layout, dtype, rng):
    K, N = 512, 192
    codes, scales, t = _random_gptq(K, N, G, 8, rng)
    mod = GPTQLinear.from_gptq(t["qweight"], t["scales"], t["g_idx"], 8, G, "cuda", dtype)
    assert mod.layout == layout and mod.qweight.is_cuda
    assert mod.qweight.dtype == (torch.int32 if layout == "triton8" else torch.int8)
    want = reference.dequantize(t["qweight"], t["scales"], t["g_idx"], 8)
    assert rel_err(mod.dequantized_weight().cpu(), want) < 1e-6
    for rows in (1, 33, 65):
        x = torch.randn(rows, K, generator=rng).to(dtype)
        ref = reference.w4a16_matmul(x.float(), t["qweight"], t["scales"], t["g_idx"], 8)
        y = mod(x.cuda())
        assert y.dtype == dtype and rel_err(y.float().cpu(), ref) < 1e-2


def test_layout_choice_by_device_bits_and_dtype():
    from salactl.quant import linear

    cuda, cpu = torch.device("cuda"), torch.device("cpu")

    def choose(device, bits, k, g, dtype, n):
        return linear.choose_layout(device, bits, k, g, dtype, n, triton_ok=True)

    for dtype in (torch.bfloat16, torch.float16, torch.float32):       # float32: bf16 activations
        assert choose(cuda, 4, 4096, 128, dtype, 4096) == "triton"
        assert choose(cuda, 8, 4096, 128, dtype, 4096) == "triton8"
        assert choose(cuda, 8, 4096, -1, dtype, 4096) == "triton8"
        assert choose(cpu, 8, 4096, 128, dtype, 4096) == "int8"
    # the 8-bit tensor-core layout needs K % 64, N % 16 and groups of 64k rows; else the int8 one
    assert choose(cuda, 8, 4096, 32, torch.bfloat16, 4096) == "int8"
    assert choose(cuda, 8, 4160, 64, torch.bfloat16, 4096) == "triton8"
    assert choose(cuda, 8, 4128, -1, torch.bfloat16, 4096) == "int8"        # K % 64
    assert choose(cuda, 8, 4096, 128, torch.bfloat16, 4104) == "int8"       # N % 16
    assert choose(cuda, 8, 4224, 192, torch.bfloat16, 4096) == "triton8"    # 192 | 4224
    assert choose(cuda, 4, 4160, 128, torch.bfloat16, 4096) == "dequant"     # K % 128
    assert choose(cuda, 4, 4096, 128, torch.bfloat16, 4104) == "triton"      # N % 16: zero rows padded
    assert choose(cpu, 4, 4096, 16, torch.float32, 4096) == "dequant"        # torch's int4 groups


def test_layout_choice_without_triton():
    """No Triton (a CUDA machine without the gpu extra): 8-bit weights take the int8 layout, 4-bit
    ones are dequantized; CPU choices do not depend on Triton."""
    from salactl.quant import linear

    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        for ok in (True, False):
            assert linear.choose_layout(cpu, 8, 4096, 128, dtype, 4096, triton_ok=ok) == "int8"
            assert linear.choose_layout(cpu, 4, 4096, 16, dtype, 4096, triton_ok=ok) == "dequant"
        assert linear.choose_layout(cuda, 4, 4096, 128, dtype, 4096, triton_ok=False) == "dequant"
        assert linear.choose_layout(cuda, 8, 4096, 128, dtype, 4096, triton_ok=False) == "int8"
        assert linear.choose_layout(cuda, 8, 4096, -1, dtype, 4096, triton_ok=False) == "int8"
    assert linear.choose_layout(cuda, 8, 4096, 32, torch.bfloat16, 4096, triton_ok=False) == "int8"


@pytest.mark.parametrize("bits", [4, 8])
def test_tensor_core_layouts_dequantize_to_the_definition(bits, rng):
    """The CUDA layouts' packed words (pack_tc / pack_tc8, pure torch) give back scale · (q − zero)."""
    from salactl.runtime.ops.w4a16.layout import pack_tc
    from salactl.runtime.ops.w8a16.layout import pack_tc8

    K, N, G = 256, 32, 128
    codes, scales, t = _random_gptq(K, N, G, bits, rng)
    q = unpack_qweight(t["qweight"], bits)                                   # [K, N]
    words = pack_tc(q) if bits == 4 else pack_tc8(q)
    mod = GPTQLinear(K, N, bits, G, "triton" if bits == 4 else "triton8",
                      {"qweight": words, "scales": t["scales"].half()})
    want = reference.dequantize(t["qweight"], t["scales"], t["g_idx"], bits)
    assert rel_err(mod.dequantized_weight(), want) < 1e-6

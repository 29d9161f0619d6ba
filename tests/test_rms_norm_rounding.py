"""RMSNorm's rounding order in bf16, bit for bit (DESIGN.md §2, reference/architecture.md §3): normalize
in fp32, round to the input dtype, THEN multiply by the weight in that dtype (two roundings, not one)."""

import torch

from salactl.runtime.layers.norm import RMSNorm, rms_norm

BF16 = torch.bfloat16


def test_two_roundings_by_hand():
    # x = [1, 3]: mean(x²) = 5, x·rsqrt(5) = [0.4472136, 1.3416408]
    # rounded to bf16 (8 significant bits): [0.447265625, 1.34375]
    # × 1.125 = [0.50317383, 1.51171875] -> bf16: [0.50390625, 1.515625] (1.51171875 is a tie: to even)
    # (rounding once, after the weight, would give 1.3416408 · 1.125 = 1.5093 -> 1.5078125)
    x = torch.tensor([1.0, 3.0], dtype=BF16)
    w = torch.tensor([1.125, 1.125], dtype=BF16)
    out = rms_norm(x, w, 1e-6)
    assert out.dtype == BF16
    assert out.tolist() == [0.50390625, 1.515625]


def test_bf16_rows_bit_exact():
    g = torch.Generator().manual_seed(0)
    x = (torch.randn(64, 256, generator=g) * 3).to(BF16)
    w = (1 + 0.5 * torch.randn(256, generator=g)).to(BF16)
    xf = x.float()
    inv = torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6)      # fp32: var = mean(x²), rsqrt(var + eps)
    normed = (xf * inv).to(BF16)                                      # first rounding
    # the product of two bf16 numbers is exact in fp32, so this rounds once more, as bf16 × bf16 does
    want = (normed.float() * w.float()).to(BF16)
    once = (xf * inv * w.float()).to(BF16)
    assert not torch.equal(want, once)          # the order is visible in these rows
    norm = RMSNorm(256, 1e-6).to(BF16)
    norm.weight.data.copy_(w)
    for got in (rms_norm(x, w, 1e-6), norm(x)):
        assert got.dtype == BF16
        assert torch.equal(got, want)

"""The split kernel walks a page in page_size // sub steps of tl.arange(0, sub) tokens and preloads
tl.arange(0, MAXP) page ids: a sub above the page (0 steps: all-zero attention), one not dividing
it, one not a power of two >= 16 (tl.dot's least K) or a preload not a power of two is refused with
one line, not run. Kernels through Triton's interpreter (as test_gpu_interpret.py runs them)."""

import os

import pytest
import torch

from salactl.runtime.ops.decode_attention.config import DEFAULT_CONFIGS, SWEEP_CONFIGS, DecodeConfig

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"     # must be set before triton is first imported


@pytest.mark.parametrize("kw,match", [(dict(sub=12), "sub 12 must be 0"), (dict(sub=8), "sub 8 must be 0"),
                                      (dict(sub=48), "sub 48 must be 0"), (dict(sub=24), "sub 24 must be 0"),
                                      (dict(sub=-16), "sub -16 must be 0"),
                                      (dict(preload=12), "preload 12 must be 0 .off. or a power of two"),
                                      (dict(preload=-4), "preload -4 must be 0")])
def test_config_refuses_steps_and_preloads_the_kernel_cannot_run(kw, match):
    with pytest.raises(ValueError, match=match) as err:
        DecodeConfig(**kw)
    assert "\n" not in str(err.value)


def test_every_shipped_config_fits_the_pages_it_runs_on():
    """The engine's defaults take whole pages (any page size); the swept configs fit the benchmark's
    and the GPU tests' 64-token pages."""
    assert all(cfg.sub == 0 for cfg in DEFAULT_CONFIGS.values())
    assert all(64 % (cfg.sub or 64) == 0 for cfg in SWEEP_CONFIGS)
    for sub in (0, 16, 32, 64):
        for preload in (0, 1, 2, 16):
            DecodeConfig(sub=sub, preload=preload)


def _pages(block: int):
    g = torch.Generator().manual_seed(block)
    hkv, hq, d = 2, 4, 16
    kp, vp = torch.randn(4, hkv, block, d, generator=g), torch.randn(4, hkv, block, d, generator=g)
    pt, slots = torch.tensor([[0, 1, 2]], dtype=torch.int32), torch.tensor([0], dtype=torch.int32)
    seq = torch.tensor([2 * block + 5], dtype=torch.int32)       # a partial last page
    return torch.randn(1, hq, d, generator=g), kp, vp, pt, slots, seq


def test_split_kernel_refuses_a_sub_that_does_not_divide_the_page():
    if torch.cuda.is_available():
        pytest.skip("CUDA present: the GPU tests cover the kernels")
    pytest.importorskip("triton")
    from salactl.runtime.ops.decode_attention.reference import paged_attention as reference
    from salactl.runtime.ops.decode_attention.triton import paged_attention, split_partials

    args = _pages(16)
    want = reference(*args)
    for sub in (0, 16):
        got = paged_attention(*args, num_splits=2, config=DecodeConfig(sub=sub))
        assert float((got - want).abs().max()) < 1e-5, sub
    for sub in (32, 64):                      # SWEEP_CONFIGS' sub=32 on 16-token pages: all zeros before
        with pytest.raises(ValueError, match=f"DecodeConfig.sub {sub} does not divide the KV pages of 16 tokens") \
                as err:
            split_partials(*args, num_splits=2, config=DecodeConfig(sub=sub, preload=2))
        assert "\n" not in str(err.value)
    args = _pages(48)                         # a page of 48: steps of 32 would leave 16 tokens unread
    with pytest.raises(ValueError, match="power of two >= 16 dividing 48"):
        paged_attention(*args, num_splits=1, config=DecodeConfig(sub=32))

"""Launch limits the Triton interpreter does not enforce but a GPU does, and buffers sized by an
argument the kernels trust: refused on the host with a message naming the fix."""

import dataclasses

import pytest
import torch

from conftest import micro_model


def test_blocks_under_16_tokens_are_refused_for_the_gpu_engine():
    """tl.dot's K is at least 16 on NVIDIA; the decode attention contracts P @ V over a page (= a
    sparse block), so 8-token blocks compile nowhere but the interpreter."""
    from salactl.errors import ConfigError
    from salactl.runtime.ops.selection.gpu import check_shapes

    cfg = micro_model().config
    small = dataclasses.replace(cfg.sparse_config, block_size=8, kernel_size=8, kernel_stride=4)
    with pytest.raises(ConfigError, match="KV pages are sparse blocks, which its attention needs >= 16 tokens, got 8"):
        check_shapes(cfg.replace(sparse_config=small))
    check_shapes(cfg)                                       # 16-token blocks run


def test_decode_selection_refuses_a_block_width_narrower_than_the_page_table():
    """Its score words are [rows, nb_max]; a row with more blocks wrote past them (heap corruption)."""
    from salactl.runtime.ops.selection.gpu import select_decode

    sc = micro_model().config.sparse_config
    n, hkv, width = 2, 2, 7
    q = torch.randn(n, 4, 16)
    k1 = torch.zeros(n * width, hkv, sc.block_size // sc.kernel_stride, 16)
    pt = torch.arange(n * width, dtype=torch.int32).reshape(n, width)
    slots, lens = torch.arange(n, dtype=torch.int32), torch.tensor([100, 60], dtype=torch.int32)
    with pytest.raises(AssertionError, match="nb_max 4 is narrower than the page table's 7 pages per row"):
        select_decode(q, k1, pt, slots, lens, sc, 4)

"""The GPU decode attention's launch rules (runtime/ops/decode_attention/config.py): plain Python,
so they run on every machine, triton or not."""

import torch


def test_decode_attention_launch_rules():
    """choose_splits never launches more programs than programs_per_sm x SMs (a partial second
    wave made the no-preload config 1.5x slower on the H200), and FP8 pages take the
    no-preload config at 8-32 rows only (the split count is the same under both configs)."""
    from salactl.runtime.ops.decode_attention.config import DEFAULT_CONFIGS, FP8_MID_ROWS, choose_splits, default_config

    fp8 = torch.float8_e4m3fn
    for rows in (1, 2, 4, 8, 16, 20, 28, 32, 64, 128, 600):
        for kv in (torch.bfloat16, fp8):
            cfg = default_config(kv, rows)
            splits = choose_splits(rows, 4096, 132, kv)
            assert 1 <= splits <= cfg.max_splits
            assert rows * splits <= cfg.programs_per_sm * 132 or splits == 1
        mid = FP8_MID_ROWS[0] <= rows <= FP8_MID_ROWS[1]
        assert default_config(fp8, rows) is DEFAULT_CONFIGS["fp8_mid" if mid else "fp8"]
        assert default_config(torch.bfloat16, rows) is DEFAULT_CONFIGS["bf16"]
    assert default_config(fp8, 16).preload == 0 and default_config(fp8, 2).preload > 0
    assert choose_splits(20, 4096, 132, fp8) == 26          # 520 programs, not 27 x 20 = 540
    assert choose_splits(2, 4096, 132, fp8) == 256           # capped by max_splits
    assert choose_splits(2, 5, 132, fp8) == 5                # never more splits than blocks


def test_max_pages_is_the_preloaded_page_ids_per_chunk():
    """DecodeConfig.max_pages: 0 without preload, else the power of 2 covering a split's pages,
    capped by `preload` (at least 2)."""
    from salactl.runtime.ops.decode_attention.config import DecodeConfig

    assert DecodeConfig().max_pages(2048, 256) == 0
    pre = DecodeConfig(preload=16)
    assert [pre.max_pages(2048, s) for s in (256, 200, 128, 64, 2048)] == [8, 16, 16, 16, 2]
    assert DecodeConfig(preload=4).max_pages(96, 3) == 4


def test_tma_pages_take_whole_pages():
    """TMA copies one whole page per operand, so a TMA config with sub-page softmax steps is
    refused when it is made, with the fix in the message."""
    import pytest

    from salactl.runtime.ops.decode_attention.config import DecodeConfig

    assert DecodeConfig(tma=True).name.endswith("tma pps4 max128")
    with pytest.raises(ValueError, match="sub=0"):
        DecodeConfig(tma=True, sub=32)

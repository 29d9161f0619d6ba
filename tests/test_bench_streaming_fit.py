"""benchmarks/decode_attention_bench.py's split of a decode-attention time into streaming and a
fixed cost per call (the numbers BENCHMARKS.md reads the FP8 target from). Plain Python: no GPU."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))


def test_streaming_fit_recovers_rate_and_fixed_costs():
    from decode_attention_bench import streaming_fit

    # 4 TB/s = 4e6 bytes per us; fixed costs 6, 8, 9, 9 us
    pts = [(c, f + b / 4e6, b) for c, f, b in ((32, 6.0, 8e6), (64, 8.0, 16e6), (128, 9.0, 32e6), (256, 9.0, 64e6))]
    tbs, fixed = streaming_fit(list(reversed(pts)))
    assert tbs == pytest.approx(4.0)
    assert [c for c, _ in fixed] == [32, 64, 128, 256]
    assert [f for _, f in fixed] == pytest.approx([6.0, 8.0, 9.0, 9.0])


def test_print_fits_needs_three_contexts_per_batch(capsys):
    from decode_attention_bench import print_fits

    rows = [dict(case=f"{k}K b1", dtype=dt, config="c", default=True, us=u)
            for k, u in ((128, 10.0), (256, 20.0)) for dt in ("bf16", "fp8_e4m3")]
    print_fits(rows, [("128K b1", 128 << 10, 1, False), ("256K b1", 256 << 10, 1, False)])
    assert capsys.readouterr().out == ""

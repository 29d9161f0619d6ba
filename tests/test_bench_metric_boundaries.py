"""Phase metrics at their edges, by hand: the p95 of every latency bench records (numpy's linear
percentile: rank 0.95·(n − 1) between the sorted values), and goodput counting a request exactly
at its SLO as good (vLLM's `slo >= value`)."""

import pytest

from salactl.bench.metrics import phase_metrics
from test_bench_metrics import result


def five_requests():
    """TTFT 10/20/30/40/100 ms; TPOT 10/20/30/40/200 ms; E2E 50/100/90/120/300 ms;
    ITL 4x10, 4x20, 2x30, 2x40, 1x200 ms."""
    return [result("a", 0.0, 0.010, 0.050, 5, [0.010] * 4),
            result("b", 0.1, 0.020, 0.100, 5, [0.020] * 4),
            result("c", 0.2, 0.030, 0.090, 3, [0.030] * 2),
            result("d", 0.3, 0.040, 0.120, 3, [0.040] * 2),
            result("e", 0.4, 0.100, 0.300, 2, [0.200]),
            result("f", 0.5, 0.001, 0.002, 4, [], ok=False)]          # failed: in no statistic


def test_p95_of_every_latency_by_hand():
    m = phase_metrics(five_requests(), 1.0)
    assert m["completed"] == 5
    # 5 values: rank 0.95 * 4 = 3.8, 80 % of the way from the 4th to the 5th smallest
    assert m["p95_ttft_ms"] == pytest.approx(40 + 0.8 * (100 - 40))            # 88
    assert m["p95_tpot_ms"] == pytest.approx(40 + 0.8 * (200 - 40))            # 168
    assert m["p95_e2e_latency_ms"] == pytest.approx(120 + 0.8 * (300 - 120))   # 264
    # 13 pooled ITLs: rank 0.95 * 12 = 11.4, between the 12th (40) and the 13th (200)
    assert m["p95_itl_ms"] == pytest.approx(40 + 0.4 * (200 - 40))             # 104
    # p90 and p99 beside them, so the three cannot trade places
    assert m["p90_ttft_ms"] == pytest.approx(40 + 0.6 * 60)
    assert m["p99_ttft_ms"] == pytest.approx(40 + 0.96 * 60)
    assert m["p90_itl_ms"] == pytest.approx(40.0)
    assert m["p99_itl_ms"] == pytest.approx(40 + 0.88 * 160)


def test_a_request_exactly_at_its_slo_is_good():
    # values exact in binary: TTFT 250 ms, TPOT (0.5 − 0.25) / 2 = 125 ms, E2E 500 ms
    at = result("a", 0.0, 0.25, 0.5, 3, [0.125, 0.125])
    assert at.tpot * 1000.0 == 125.0
    every = {"ttft": 250, "tpot": 125, "e2el": 500}
    for slo in ({"ttft": 250}, {"tpot": 125}, {"e2el": 500}, every):
        assert phase_metrics([at], 2.0, slo)["request_goodput"] == 0.5, slo
    # a hair over any one of them is not
    for slo in ({"ttft": 249.99}, {"tpot": 124.99}, {"e2el": 499.99}):
        assert phase_metrics([at], 2.0, slo)["request_goodput"] == 0.0, slo

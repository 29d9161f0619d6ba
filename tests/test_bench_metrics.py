"""Phase metrics against hand-computed values, SLO/reference parsing, SOAR score, arrivals."""

import math

import numpy as np
import pytest

from salactl.bench.metrics import one_batch_metrics, parse_slo, phase_metrics
from salactl.bench.requests import RequestResult
from salactl.bench.runner import arrival_times
from salactl.bench.scoring import (accuracy_coefficient, check_reference, parse_reference,
                                   soar_score)
from salactl.errors import UsageError


def result(rid, start, ttft, latency, out, itl, ok=True, inp=10):
    return RequestResult(rid, "P", inp, out, start_time=start, success=ok, ttft=ttft,
                         latency=latency, output_len=out if ok else 0, itl=itl,
                         error="" if ok else "boom")


def sample():
    return [result("a", 0.0, 0.1, 0.5, 5, [0.1] * 4),
            result("b", 0.2, 0.3, 0.3, 1, []),
            result("c", 0.1, 0.0, 0.2, 4, [], ok=False)]


def test_phase_metrics_by_hand():
    m = phase_metrics(sample(), 1.0)
    assert (m["completed"], m["failed"]) == (2, 1)
    assert m["total_input_tokens"] == 20 and m["total_output_tokens"] == 6
    assert m["request_throughput"] == 2.0 and m["output_throughput"] == 6.0
    assert m["total_throughput"] == 26.0 and m["input_throughput"] == 20.0
    assert m["mean_ttft_ms"] == pytest.approx(200.0)
    assert m["median_ttft_ms"] == pytest.approx(200.0)
    assert m["std_ttft_ms"] == pytest.approx(100.0)           # population std, as numpy
    assert m["p99_ttft_ms"] == pytest.approx(298.0)           # linear: 100 + 0.99 * 200
    assert m["p90_ttft_ms"] == pytest.approx(280.0)
    assert m["mean_tpot_ms"] == pytest.approx(100.0)          # 1-token request skipped
    assert m["mean_itl_ms"] == pytest.approx(100.0) and m["max_itl_ms"] == pytest.approx(100.0)
    assert m["mean_e2e_latency_ms"] == pytest.approx(400.0)
    assert m["concurrency"] == pytest.approx(0.8)             # (0.5 + 0.3) / 1.0
    assert m["max_output_tokens_per_s"] is None               # 0.5 s of requests: no full second
    assert m["max_concurrent_requests"] == 2                  # a and b both run in [0.2, 0.5]
    assert "request_goodput" not in m


def test_max_concurrent_requests_is_the_peak_in_flight_at_one_instant():
    # each ends as the next is sent (steps of 1/16 s, exact in binary)
    one_at_a_time = [result(str(i), i / 16, 0.01, 1 / 16, 2, [0.03]) for i in range(12)]
    assert phase_metrics(one_at_a_time, 0.75)["max_concurrent_requests"] == 1
    pairs = [result("a", 0.0, 0.1, 1.0, 2, [0.9]), result("b", 0.5, 0.1, 1.0, 2, [0.9]),
             result("c", 1.2, 0.1, 1.0, 2, [0.9])]       # a+b, then b+c; all three touch second 1
    assert phase_metrics(pairs, 2.2)["max_concurrent_requests"] == 2


def test_max_output_tokens_per_s_counts_full_one_second_buckets():
    # 10 tokens at 0.05 .. 0.5 s, then 5 at 1.05 .. 1.25 s: 10 in bucket [0, 1), 5 in [1, 2)
    rs = [result("a", 0.0, 0.05, 0.5, 10, [0.05] * 9), result("b", 0.95, 0.1, 0.3, 5, [0.05] * 4)]
    m = phase_metrics(rs, 1.25)
    assert m["max_output_tokens_per_s"] == 10.0
    assert m["output_throughput"] == 12.0
    short = [result("a", 0.0, 0.05, 0.5, 10, [0.05] * 9)]     # 20 tok/s for 0.5 s: no full second
    assert phase_metrics(short, 0.5)["max_output_tokens_per_s"] is None


def test_goodput_uses_every_slo():
    rs = sample()
    assert phase_metrics(rs, 1.0, {"ttft": 150})["request_goodput"] == 1.0    # a only
    assert phase_metrics(rs, 2.0, {"tpot": 50})["request_goodput"] == 0.5     # b only (tpot 0)
    assert phase_metrics(rs, 1.0, {"ttft": 500, "tpot": 500, "e2el": 400})["request_goodput"] == 1.0


def test_empty_phase_gives_none_not_zero():
    m = phase_metrics([result("c", 0, 0, 0.1, 3, [], ok=False)], 0.5)
    assert m["completed"] == 0 and m["failed"] == 1
    assert m["mean_ttft_ms"] is None and m["p99_itl_ms"] is None and m["concurrency"] is None


def test_one_batch_fields():
    rs = [result("a", 0.0, 0.2, 0.5, 4, [0.1, 0.1, 0.1]), result("b", 0.0, 0.3, 0.6, 4, [0.1] * 3)]
    m = one_batch_metrics(rs, 0.6, 2, 100, 4)
    assert m["prefill_latency"] == 0.3 and m["prefill_throughput"] == pytest.approx(20 / 0.3)
    assert m["median_decode_latency"] == pytest.approx(0.1)
    assert m["median_decode_throughput"] == pytest.approx(20.0)
    assert m["overall_throughput"] == pytest.approx(28 / 0.6)     # 2 x (10 in + 4 out), as sent
    failed_and_short = [rs[0], result("b", 0.0, 0.3, 0.3, 1, []), result("c", 0.0, 0.1, 0.2, 4, [], ok=False)]
    m = one_batch_metrics(failed_and_short, 0.6, 3, 10, 4)
    assert m["prefill_throughput"] == pytest.approx(20 / 0.3) and m["overall_throughput"] == pytest.approx(25 / 0.6)
    assert m["median_decode_throughput"] == pytest.approx(10.0)  # one request still decoding
    slow_step = [result("a", 0.0, 0.2, 0.9, 4, [0.1, 0.1, 0.5]), result("b", 0.0, 0.2, 0.5, 4, [0.1] * 3)]
    assert one_batch_metrics(slow_step, 0.9, 2, 10, 4)["median_decode_latency"] == pytest.approx(0.1)   # not the mean


def test_parse_slo_and_reference():
    assert parse_slo("ttft=500, tpot=50") == {"ttft": 500.0, "tpot": 50.0}
    with pytest.raises(UsageError, match="--slo"):
        parse_slo("latency=5")
    with pytest.raises(UsageError, match="positive"):
        parse_slo("ttft=-1")
    assert parse_reference("S1=1.5,S8=2,Smax=3") == {"S1": 1.5, "S8": 2.0, "Smax": 3.0}
    with pytest.raises(UsageError, match="seconds"):
        parse_reference("S1=fast")
    w = {"S1": 0.4, "S8": 0.3, "Smax": 0.3}
    with pytest.raises(UsageError, match="lacks Smax"):
        check_reference({"S1": 1.0, "S8": 1.0}, w)
    with pytest.raises(UsageError, match="not a scored phase"):
        check_reference({"S1": 1, "S8": 1, "Smax": 1, "S2": 1}, w)


def test_soar_score_formula():
    w = {"S1": 0.4, "S8": 0.3, "Smax": 0.3}
    # team-beta's v18-A durations scored against their pre-v18 package as the reference
    own = {"S1": 426.06, "S8": 620.73, "Smax": 1169.84}
    ref = {"S1": 596.25, "S8": 1066.35, "Smax": 2746.62}
    s = soar_score(own, ref, w, accuracy=98.5)
    perf = 0.4 * 596.25 / 426.06 * 100 + 0.3 * 1066.35 / 620.73 * 100 + 0.3 * 2746.62 / 1169.84 * 100
    assert s["performance"] == pytest.approx(perf)
    assert s["accuracy_coefficient"] == 0.96 and s["score"] == pytest.approx(perf * 0.96)
    assert soar_score(own, own, w)["score"] == pytest.approx(100.0)
    assert soar_score({"S1": 1.0}, ref, w)["score"] is None          # interrupted run
    assert [accuracy_coefficient(a) for a in (97.0, 97.5, 98.0, 98.01, 99.0, 99.5, None)] == \
        [0.0, 0.92, 0.92, 0.96, 0.96, 1.0, 1.0]


def test_arrivals_poisson_and_gamma():
    assert arrival_times(4, math.inf, 1.0, 0) == [0.0] * 4
    t = arrival_times(4001, 10.0, 1.0, 7)
    gaps = np.diff(t)
    assert t[0] == 0.0 and np.all(gaps >= 0)
    assert gaps.mean() == pytest.approx(0.1, rel=0.06)
    assert gaps.std() == pytest.approx(0.1, rel=0.1)                  # exponential: std = mean
    bursty = np.diff(arrival_times(4001, 10.0, 0.25, 7))
    assert bursty.mean() == pytest.approx(0.1, rel=0.15)
    assert bursty.std() == pytest.approx(0.2, rel=0.15)              # gamma k=0.25: cv = 2
    assert arrival_times(5, 2.0, 1.0, 3) == arrival_times(5, 2.0, 1.0, 3)


def test_summary_table_shows_gpu_memory_and_energy_only_when_measured():
    from salactl.bench.summary import table_rows

    base = {"phase": "S1", "max_concurrency": 1, "completed": 3, "failed": 0, "duration": 2.0}
    cols, _ = table_rows({"phases": [dict(base)]})
    assert "peak GiB" not in cols and "J/out tok" not in cols
    gpu = dict(base, peak_gpu_memory_bytes=3 * 2 ** 30, mean_power_w=400.0, energy_per_output_token_j=0.5)
    cols, rows = table_rows({"phases": [gpu]})
    assert rows[0][cols.index("peak GiB")] == 3.0
    assert rows[0][cols.index("W")] == 400.0 and rows[0][cols.index("J/out tok")] == 0.5

"""Phase metrics at the edges of their definitions, by hand (times exact in binary): the 1-second
buckets of max_output_tokens_per_s (a span of exactly 1 s, tokens at the span's end, tokens late in
a second), a request that took no time for max_concurrent_requests, and max ITL from one entry."""

from salactl.bench.metrics import phase_metrics
from test_bench_metrics import result


def test_a_span_of_exactly_one_second_has_one_full_bucket_holding_the_tokens_at_its_end():
    rs = [result("a", 0.0, 0.25, 0.5, 2, [0.25]),     # tokens at 0.25, 0.5: bucket [0, 1) holds 2
          result("b", 0.0, 1.0, 1.0, 3, [])]          # one chunk of 3 tokens at t1 = 1.0: bucket [1, 2)
    m = phase_metrics(rs, 1.0)
    # t1 - t0 = 1.0 is a full second (not None); the 3 tokens at exactly t1 count, and win
    assert m["max_output_tokens_per_s"] == 3.0


def test_the_last_partial_second_is_a_bucket_too():
    rs = [result("a", 0.0, 0.5, 0.5, 1, []),          # 1 token at 0.5: bucket [0, 1)
          result("b", 0.5, 1.0, 1.0, 4, [])]          # 4 tokens at 1.5 = t1: bucket [1, 2), cut short
    assert phase_metrics(rs, 1.5)["max_output_tokens_per_s"] == 4.0


def test_a_token_late_in_a_second_counts_in_that_second_not_the_next():
    rs = [result("a", 0.0, 0.25, 0.25, 1, []),        # 1 token at 0.25
          result("b", 0.0, 0.75, 1.0, 3, [])]         # 3 tokens at 0.75, the stream ends at 1.0
    # all 4 in bucket [0, 1) (rounding 0.75 up to second 1 would leave 1 and 3)
    assert phase_metrics(rs, 1.0)["max_output_tokens_per_s"] == 4.0
    # the same late in a later second: ITL steps 0.25 + 0.5 = 0.75 and 1.25 + 0.5 = 1.75
    rs = [result("a", 0.0, 0.25, 1.75, 4, [0.5, 0.5, 0.5]),    # tokens at 0.25, 0.75, 1.25, 1.75
          result("b", 1.0, 0.75, 0.75, 2, [])]                 # 2 tokens at 1.75
    # bucket [0, 1): 2; bucket [1, 2): 1.25, 1.75 and b's two = 4
    assert phase_metrics(rs, 1.75)["max_output_tokens_per_s"] == 4.0


def test_a_request_that_took_no_time_is_one_in_flight():
    # [send, end) is empty: no instant holds it, yet a completed phase ran at least one request
    m = phase_metrics([result("a", 0.5, 0.0, 0.0, 1, [])], 1.0)
    assert m["completed"] == 1 and m["max_concurrent_requests"] == 1
    at_once = [result(str(i), 0.5, 0.0, 0.0, 1, []) for i in range(3)]
    assert phase_metrics(at_once, 1.0)["max_concurrent_requests"] == 1


def test_max_itl_from_a_single_entry_and_from_the_first_entry():
    one = [result("a", 0.0, 0.25, 0.375, 2, [0.125]),   # its one ITL: 125 ms
           result("b", 0.0, 0.25, 0.25, 1, [])]         # one token: no ITL
    m = phase_metrics(one, 1.0)
    assert m["max_itl_ms"] == 125.0 and m["mean_itl_ms"] == 125.0
    first = [result("a", 0.0, 0.25, 0.875, 3, [0.5, 0.125])]   # the largest ITL comes first
    assert phase_metrics(first, 1.0)["max_itl_ms"] == 500.0

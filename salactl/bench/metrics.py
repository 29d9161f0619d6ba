"""Phase metrics with SGLang's / vLLM's definitions and field names (reference/benchmarks.md §3).

- duration: from dispatch of the first timed request until every request has returned.
- completed / failed; totals count successful requests only (SGLang).
- short_outputs: successful requests that got fewer tokens than asked, by the server's count or
  clearly fewer by re-tokenizing the streamed text (RequestResult.short); output_len_estimated:
  requests whose server sent no token count (counted client-side).
- request/input/output/total throughput = count / duration.
- TTFT = send → first chunk carrying tokens (without per-chunk counts: the first non-empty text);
  E2E = send → end of stream;
  TPOT = (E2E − TTFT) / (output_len − 1) per request, requests with ≤ 1 output token skipped;
  ITL pooled over requests, one entry per token after the first chunk, each chunk's gap spread
  evenly over the tokens it carries (SGLang `/generate`); a count known only at the end (usage in
  a last chunk, or estimated) is spread evenly over the chunks after the first (runner.spread_count).
- mean / median / std (population) / p90 / p95 / p99 with numpy's linear percentiles; max ITL.
- concurrency = Σ E2E / duration (SGLang).
- max_output_tokens_per_s: output tokens counted into 1-second buckets from the first request's
  send time (the first chunk's tokens at its arrival, each later token at its ITL step), the
  fullest bucket (vLLM); None when the successful requests span under 1 s (no
  bucket is a full second). Like vLLM's, it can sit a little below output_throughput when the
  tokens spread evenly over a span that is not a whole number of seconds (the buckets are fixed,
  not sliding).
- max_concurrent_requests: the most requests in flight at one instant, each over
  [send, end of stream) (a request ending as another is sent does not overlap it), as recent vLLM
  counts it. SGLang (and older vLLM) count every request active at any time within a 1-second
  bucket, which adds up requests that never ran together (12 one-at-a-time requests in a 0.8 s
  phase would give 12, not 1).
- request_goodput (when SLOs are given): requests whose TTFT, TPOT (0 for ≤ 1 token) and E2E are
  all ≤ their SLO, per second (vLLM / DistServe).
Empty samples give None (SGLang would print 0).
"""

from __future__ import annotations

import math

import numpy as np

from salactl.bench.requests import RequestResult
from salactl.bench.pairs import parse_positive_pairs

STATS = ("mean", "median", "std", "p90", "p95", "p99")
SLO_KEYS = ("ttft", "tpot", "e2el")


def summarize(values: list[float], name: str) -> dict[str, float | None]:
    """{mean,median,std,p90,p95,p99}_{name}_ms from values in seconds."""
    if not values:
        return {f"{s}_{name}_ms": None for s in STATS}
    a = np.asarray(values, dtype=np.float64) * 1000.0
    return {
        f"mean_{name}_ms": float(np.mean(a)),
        f"median_{name}_ms": float(np.median(a)),
        f"std_{name}_ms": float(np.std(a)),
        f"p90_{name}_ms": float(np.percentile(a, 90)),
        f"p95_{name}_ms": float(np.percentile(a, 95)),
        f"p99_{name}_ms": float(np.percentile(a, 99)),
    }


def parse_slo(text: str | None) -> dict[str, float]:
    """`ttft=500,tpot=50[,e2el=...]` in milliseconds."""
    return parse_positive_pairs(text, "--slo", "ms", "ttft=500,tpot=50", SLO_KEYS)


def _max_output_tokens_per_s(ok: list[RequestResult]) -> float | None:
    t0 = min(r.start_time for r in ok)
    t1 = max(r.start_time + r.latency for r in ok)
    if t1 - t0 < 1.0:
        return None
    tokens = np.zeros(int(math.ceil(t1 - t0)) + 1)
    for r in ok:
        t = r.start_time + r.ttft
        times = [(t, r.output_len - len(r.itl))]        # the first chunk may carry several tokens
        for gap in r.itl:
            t += gap
            times.append((t, 1))
        for x, n in times:
            b = int(x - t0)
            if 0 <= b < len(tokens):
                tokens[b] += n
    return float(tokens.max())


def _max_concurrent_requests(ok: list[RequestResult]) -> int:
    """The peak of requests in flight, reached at some request's send time: those sent by then
    minus those ended by then (an end at that instant no longer counts)."""
    starts = np.sort([r.start_time for r in ok])
    ends = np.sort([r.start_time + r.latency for r in ok])
    in_flight = np.searchsorted(starts, starts, "right") - np.searchsorted(ends, starts, "right")
    return max(int(in_flight.max()), 1)     # 1: a request that took no time at all


def good_requests(ok: list[RequestResult], slo: dict[str, float]) -> int:
    good = 0
    for r in ok:
        vals = {"ttft": r.ttft, "tpot": r.tpot or 0.0, "e2el": r.latency}
        if all(vals[k] * 1000.0 <= ms for k, ms in slo.items()):
            good += 1
    return good


def phase_metrics(results: list[RequestResult], duration: float, slo: dict[str, float] | None = None) -> dict:
    ok = [r for r in results if r.success]
    total_in = sum(r.input_len for r in ok)
    total_out = sum(r.output_len for r in ok)

    def per_s(x: float) -> float | None:
        return x / duration if duration > 0 else None

    m: dict = {
        "duration": duration,
        "completed": len(ok),
        "failed": len(results) - len(ok),
        "total_input_tokens": total_in,
        "total_output_tokens": total_out,
        "request_throughput": per_s(len(ok)),
        "input_throughput": per_s(total_in),
        "output_throughput": per_s(total_out),
        "total_throughput": per_s(total_in + total_out),
        "short_outputs": sum(r.short for r in ok),
        "output_len_estimated": sum(r.output_len_estimated for r in ok),
    }
    itls = [x for r in ok for x in r.itl]
    m.update(summarize([r.ttft for r in ok], "ttft"))
    m.update(summarize([t for r in ok if (t := r.tpot) is not None], "tpot"))
    m.update(summarize(itls, "itl"))
    m["max_itl_ms"] = max(itls) * 1000.0 if itls else None
    m.update(summarize([r.latency for r in ok], "e2e_latency"))
    m["concurrency"] = per_s(sum(r.latency for r in ok)) if ok else None
    m["max_output_tokens_per_s"] = _max_output_tokens_per_s(ok) if ok else None
    m["max_concurrent_requests"] = _max_concurrent_requests(ok) if ok else None
    if slo:
        m["request_goodput"] = per_s(good_requests(ok, slo))
        m["slo"] = dict(slo)
    return m


def one_batch_metrics(results: list[RequestResult], duration: float, batch_size: int,
                      input_len: int, output_len: int) -> dict:
    """Client-side analogues of SGLang bench_one_batch's fields for a batch sent at once:
    prefill_latency = the last request's TTFT (the whole batch has its first token);
    median_decode_latency = median ITL (one decode step of the batch); total_latency = duration.
    Throughputs count the tokens the successful requests really sent and got back (fewer than
    batch_size x the nominal lengths when requests fail or stop early)."""
    ok = [r for r in results if r.success]
    if not ok:
        return {}
    prefill = max(r.ttft for r in ok)
    itls = [x for r in ok for x in r.itl]
    dec = float(np.median(itls)) if itls else None
    tokens_in = sum(r.input_len for r in ok)
    tokens_out = sum(r.output_len for r in ok)
    decoding = sum(1 for r in ok if r.itl)         # requests still in the batch's decode steps
    return {
        "batch_size": batch_size,
        "input_len": input_len,
        "output_len": output_len,
        "prefill_latency": prefill,
        "prefill_throughput": tokens_in / prefill if prefill > 0 else None,
        "median_decode_latency": dec,
        "median_decode_throughput": decoding / dec if dec else None,
        "total_latency": duration,
        "overall_throughput": (tokens_in + tokens_out) / duration if duration > 0 else None,
    }

"""Bench against a real HTTP server on loopback with injected timings (chunks of 1 and 2 tokens).
Reported metrics must match the injection within 5%; the 5% test injects 500 ms TTFT and 50 ms per
token so a few ms of scheduling noise on a busy 2-core CI machine stay well inside the bound, and
runs again when a stall of the machine (up to a second) upsets one run. Timeouts are checked against
injected stalls far longer than a machine stall, so the bound on the time taken can be wide."""

import csv
import json
import socket
import statistics
import threading
import time

import pytest

from bench_server import FakeServer, in_one_of_three_runs
from salactl.bench.metrics import phase_metrics
from salactl.bench.profiles import Phase
from salactl.bench.runner import run_phase, run_request
from salactl.bench.synthetic import random_lengths
from salactl.bench.targets.http import HttpTarget
from salactl.errors import EndpointError, UsageError

TTFT, PER_TOKEN, OUT = 0.2, 0.02, 12


def close(a, b, rel=0.05):
    return abs(a - b) <= rel * abs(b)


pytestmark = pytest.mark.usefixtures("quick_thread_switches")


@pytest.mark.parametrize("backend", ["sglang", "openai"])
def test_metrics_match_injected_timings(backend):
    TTFT, PER_TOKEN = 0.5, 0.05

    def one_run():
        with FakeServer(TTFT, PER_TOKEN) as srv, HttpTarget(srv.url, backend, flush_sleep_s=0.0) as target:
            target.check()
            reqs = random_lengths(4, 16, OUT, vocab_size=1000, seed=3)
            phase = Phase("P", max_concurrency=2)
            out = run_phase(target, phase, reqs, seed=1)
            m = phase_metrics(out.results, out.duration)

        assert m["completed"] == 4 and m["failed"] == 0
        assert m["total_output_tokens"] == 4 * OUT
        assert m["total_input_tokens"] == 4 * 16
        per_request = srv.request_time(OUT)                           # 0.5 + 11 * 0.05 = 1.05 s
        # Medians within 5%: the per-request timings the server injected. Means within 15%: one
        # request delayed by a busy CI core must not flake the test.
        assert close(m["median_ttft_ms"], TTFT * 1e3), m["median_ttft_ms"]
        assert close(m["median_tpot_ms"], PER_TOKEN * 1e3), m["median_tpot_ms"]
        # per-token ITL: 2-token chunks arrive 40 ms apart and count as two 20 ms gaps
        assert close(m["median_itl_ms"], PER_TOKEN * 1e3), m["median_itl_ms"]
        assert close(m["median_e2e_latency_ms"], per_request * 1e3), m["median_e2e_latency_ms"]
        for key, want in (("mean_ttft_ms", TTFT), ("mean_tpot_ms", PER_TOKEN), ("mean_itl_ms", PER_TOKEN),
                          ("mean_e2e_latency_ms", per_request)):
            assert close(m[key], want * 1e3, rel=0.15), (key, m[key])
        # 4 requests, 2 at a time: two rounds
        assert close(m["duration"], 2 * per_request), m["duration"]
        assert close(m["output_throughput"], 4 * OUT / (2 * per_request)), m["output_throughput"]
        assert close(m["request_throughput"], 4 / (2 * per_request)), m["request_throughput"]
        assert close(m["concurrency"], 2.0)
        # one entry per token after the first chunk
        assert all(len(r.itl) == OUT - 1 for r in out.results)
        # the warmup (capped at 32 tokens) and the flush happened before the timed requests
        assert srv.flushes == 1 and len(srv.requests) == 5
        body = srv.requests[-1]["body"]
        if backend == "sglang":
            assert body["sampling_params"] == {"temperature": 0.0, "max_new_tokens": OUT, "ignore_eos": True}
            assert len(body["input_ids"]) == 16 and body["stream"] is True
        else:
            assert body["model"] == "fake-model" and body["max_tokens"] == OUT and body["ignore_eos"] is True
            assert len(body["prompt"]) == 16

    in_one_of_three_runs(one_run)       # a stall shifts one run's timings by up to a second


def test_unlimited_concurrency_sends_all_at_once():
    def one_run():
        with FakeServer(TTFT, PER_TOKEN) as srv, HttpTarget(srv.url, "sglang", flush_sleep_s=0.0) as target:
            reqs = random_lengths(6, 4, 4, vocab_size=1000, seed=1)
            out = run_phase(target, Phase("Smax", warmup_requests=0, flush_cache=False), reqs)
            m = phase_metrics(out.results, out.duration)
        assert m["completed"] == 6
        assert m["max_concurrent_requests"] == 6            # all in flight at once, not 6 rounds

    in_one_of_three_runs(one_run)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_unreachable_endpoint_fails_fast():
    port = _free_port()
    t = time.perf_counter()
    with HttpTarget(f"http://127.0.0.1:{port}", "sglang") as target, \
            pytest.raises(EndpointError, match="cannot reach .*connection refused"):
        target.check()
    assert time.perf_counter() - t < 10.0       # not the side requests' 30 s wait


@pytest.mark.parametrize("endpoint", ["http://127.0.0.1:99999", "http://127.0.0.1:abc", "http://[::1",
                                      "http://127.0.0.1:0", "ftp://127.0.0.1:30000", "http://"])
def test_bad_endpoint_urls_are_usage_errors(endpoint):
    with pytest.raises(UsageError, match="--endpoint must be an http\\(s\\) URL"):
        HttpTarget(endpoint, "sglang")


def _timed_out(srv, timeout_s: float, out_len: int = 4):
    """One request under a `timeout_s` --request-timeout: (result, seconds it took)."""

    with HttpTarget(srv.url, "sglang", flush_sleep_s=0.0, read_timeout_s=timeout_s) as target:
        t = time.perf_counter()
        res = run_request(target, random_lengths(1, 4, out_len, 1000)[0], out_len, "P", threading.Event())
        return res, time.perf_counter() - t


def test_a_server_that_stops_sending_fails_the_request_after_the_request_timeout():
    with FakeServer(ttft=60.0, per_token=PER_TOKEN) as srv:
        res, took = _timed_out(srv, 0.3)
    assert took < 10.0
    assert not res.success and res.error == ("no complete answer within 0.3 s (--request-timeout, the total "
                                             "time one request may take)")


def test_keep_alive_comments_do_not_extend_the_request_timeout():
    with FakeServer(ttft=30.0, per_token=PER_TOKEN) as srv:
        srv.ping_every = 0.05                   # a `: ping` every 50 ms, never a token
        res, took = _timed_out(srv, 0.5)
    assert 0.5 <= took < 10.0 and not res.success and "no complete answer within 0.5 s" in res.error


def test_a_token_trickle_is_cut_at_the_total_request_timeout():
    with FakeServer(ttft=0.05, per_token=0.1) as srv:    # 300 tokens take 30 s, each gap only 0.1 s
        res, took = _timed_out(srv, 0.6, out_len=300)
    assert 0.6 <= took < 10.0 and not res.success and "no complete answer within 0.6 s" in res.error


def _silent_port():
    """A listening socket that accepts connections and never answers."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(8)
    return s


def test_a_silent_probe_fails_after_min_30_s_and_the_request_timeout_naming_the_wait():
    with _silent_port() as s:
        t = time.perf_counter()
        with HttpTarget(f"http://127.0.0.1:{s.getsockname()[1]}", "openai", read_timeout_s=0.4) as target, \
                pytest.raises(EndpointError, match=r"GET http://127.0.0.1:\d+/v1/models did not answer within 0.4 s"):
            target.check()
    assert time.perf_counter() - t < 10.0       # not 30 s


def test_a_silent_cache_flush_is_a_warning_and_reports_no_flush(capfd):
    with _silent_port() as s:
        t = time.perf_counter()
        with HttpTarget(f"http://127.0.0.1:{s.getsockname()[1]}", "openai", flush_sleep_s=0.0,
                        read_timeout_s=0.3) as target:
            assert target.flush_cache() is False and target.flush_cache() is False
    assert time.perf_counter() - t < 10.0       # not 30 s each
    err = capfd.readouterr().err
    assert err.count("warning") == 1 and "the prefix cache was not flushed: POST" in err
    assert "/reset_prefix_cache did not answer within 0.3 s" in err


def test_an_endpoint_with_a_query_string_is_refused():
    with pytest.raises(UsageError, match=r"without a query string or fragment, got 'http://h:1/v1\?x=1'"):
        HttpTarget("http://h:1/v1?x=1", "openai")


def test_ipv6_hosts_keep_their_brackets():
    port = _free_port()
    with HttpTarget(f"http://[::1]:{port}/v1", "openai") as target:
        assert target.url == f"http://[::1]:{port}" and target.knobs()["endpoint"] == target.url
        with pytest.raises(EndpointError, match=rf"cannot reach http://\[::1\]:{port} "):
            target.check()


def test_https_to_a_plain_http_server_hints_at_http():
    with FakeServer(0.01, 0.001) as srv:
        port = srv.url.rsplit(":", 1)[1]
        with HttpTarget(srv.url.replace("http://", "https://"), "sglang") as target, \
                pytest.raises(EndpointError, match=rf"use http://127.0.0.1:{port}\)"):
            target.check()


def test_a_compressed_stream_is_refused_and_identity_was_asked_for():

    with FakeServer(0.01, 0.001) as srv:
        srv.content_encoding = "gzip"
        with HttpTarget(srv.url, "sglang", flush_sleep_s=0.0) as target:
            res = run_request(target, random_lengths(1, 4, 4, 1000)[0], 4, "P", threading.Event())
    assert srv.seen_headers[0]["Accept-Encoding"] == "identity"
    assert not res.success and res.error.startswith("the server sent a gzip-compressed stream"), res.error


def test_a_line_longer_than_16_mib_fails_the_request():

    with FakeServer(0.01, 0.001) as srv:
        srv.edit_event = lambda e: {**e, "pad": "A" * (17 * 2 ** 20)}
        with HttpTarget(srv.url, "sglang", flush_sleep_s=0.0) as target:
            res = run_request(target, random_lengths(1, 4, 4, 1000)[0], 4, "P", threading.Event())
    assert not res.success and res.error.startswith("the server streamed a line longer than 16 MiB"), res.error


def _set_count(value, key="meta_info"):
    def edit(event):
        if key == "meta_info":
            event["meta_info"]["completion_tokens"] = value
        else:
            event["usage"]["completion_tokens"] = value
        return event
    return edit


@pytest.mark.parametrize("backend,edit,message", [
    ("sglang", _set_count(10 ** 9), "meta_info.completion_tokens = 1000000000 for max_tokens 4"),
    ("sglang", _set_count("abc"), "meta_info.completion_tokens = 'abc', not a token count"),
    ("sglang", _set_count(2.5), "meta_info.completion_tokens = '2.5', not a token count"),
    ("sglang", lambda e: {**e, "meta_info": [1, 2]}, "meta_info = '[1, 2]', not an object"),
    ("openai", _set_count(-1, "usage"), "usage.completion_tokens = -1 for max_tokens 4"),
    ("openai", lambda e: {**e, "usage": [1]}, "usage = '[1]', not an object"),
    ("openai", lambda e: {**e, "choices": 5}, "choices = '5', not a list"),
    ("openai", lambda e: {**e, "choices": {"index": 0, "text": "x"}}, "choices = \"{'index': 0, 'text': 'x'}\", not a list"),
])
def test_impossible_or_malformed_token_counts_fail_the_request(backend, edit, message):

    with FakeServer(0.01, 0.001) as srv:
        srv.edit_event = edit
        with HttpTarget(srv.url, backend, flush_sleep_s=0.0) as target:
            target.check()
            res = run_request(target, random_lengths(1, 4, 4, 1000)[0], 4, "P", threading.Event())
    assert not res.success and message in res.error, res.error


def test_http_errors_count_as_failed_requests():
    with FakeServer(TTFT, PER_TOKEN) as srv, HttpTarget(srv.url, "sglang", flush_sleep_s=0.0) as target:
        target.generate_path = "/missing"           # the server answers 404 for this path
        res = run_request(target, random_lengths(1, 4, 4, 1000)[0], 4, "P", threading.Event())
    assert not res.success and res.error == f'HTTP 404 Not Found: {{"error": "not found"}} (POST {srv.url}/missing)'
    m = phase_metrics([res], 1.0)
    assert m["failed"] == 1 and m["completed"] == 0 and m["mean_ttft_ms"] is None


def test_a_redirect_names_its_location():

    with FakeServer(0.01, 0.001) as srv:
        srv.reject = lambda nth, body: (307, {}, {"Location": "/api/generate"})
        with HttpTarget(srv.url, "sglang", flush_sleep_s=0.0) as target:
            res = run_request(target, random_lengths(1, 4, 4, 1000)[0], 4, "P", threading.Event())
    assert res.error.endswith(f"(POST {srv.url}/generate, redirected to /api/generate: point --endpoint there)")


def test_request_rate_dispatch_follows_poisson_arrivals():
    from salactl.bench.runner import arrival_times

    want = arrival_times(6, 5.0, 1.0, 5)
    assert want[-1] > 0.5                                    # really spread out, not all at t=0

    def one_run():
        with FakeServer(0.01, 0.001) as srv, HttpTarget(srv.url, "sglang", flush_sleep_s=0.0) as target:
            reqs = random_lengths(6, 4, 2, vocab_size=1000, seed=1)
            phase = Phase("R", request_rate=5.0, warmup_requests=0, flush_cache=False)
            out = run_phase(target, phase, reqs, seed=5)
        t0 = out.results[0].start_time
        got = [r.start_time - t0 for r in out.results]
        # 60 ms of slack for thread wake-ups on a loaded machine, against arrivals spread over ~1 s
        assert all(abs(g - w) < 0.06 for g, w in zip(got, want)), (got, want)

    in_one_of_three_runs(one_run)                            # a stall of the machine delays one run's sends


def test_one_batch_profile_against_server(tmp_path):
    from salactl.bench.job import BenchSettings, run_bench

    with FakeServer(TTFT, PER_TOKEN) as srv:
        run = run_bench(BenchSettings(profile="decode", endpoint=srv.url, backend="openai", scale=0.02,
                                      flush_sleep=0.0, details=True, out=tmp_path)).to_dict()
    assert [p["phase"] for p in run["phases"]] == ["decode-bs1", "decode-bs8", "decode-bs32"]
    with open(run["phases"][0]["details_csv"], newline="") as f:
        rows = list(csv.DictReader(f))
    out_len, in_len = round(256 * 0.02), round(1024 * 0.02)
    for p, bs in zip(run["phases"], (1, 8, 32)):
        assert p["batch_size"] == bs == p["completed"] == p["max_concurrency"]
        assert p["input_len"] == in_len and p["output_len"] == out_len
        batch = [r for r in rows if r["phase"] == p["phase"]]
        ttft_ms = [float(r["ttft_ms"]) for r in batch]
        itl_ms = [x for r in batch for x in json.loads(r["itl_ms"])]
        # the last of the batch to get its first token: its TTFT, not its E2E (no decode time in it),
        # at least the injected TTFT and before the phase ends; checked against the requests' own
        # timings (the details CSV), as scheduler delay on a loaded 2-core CI machine (408 ms of
        # start-up skew at bs 32, a first chunk recorded a token period late) bends any bound on the
        # injected timings alone
        assert p["prefill_latency"] * 1e3 == pytest.approx(max(ttft_ms), abs=1e-3), (p, ttft_ms)
        assert TTFT <= p["prefill_latency"] < p["total_latency"], p
        # the median TTFT: never before the injected delay, at most the batch's last first token, in ms
        assert p["median_ttft_ms"] == pytest.approx(statistics.median(ttft_ms), abs=1e-3), (p, ttft_ms)
        assert TTFT * 1e3 <= p["median_ttft_ms"] <= p["prefill_latency"] * 1e3 + 1e-6, p
        # one decode step of the batch: the median of the per-token ITLs, in seconds
        assert p["median_decode_latency"] * 1e3 == pytest.approx(statistics.median(itl_ms), abs=1e-3), p
        assert p["median_decode_throughput"] == pytest.approx(bs / p["median_decode_latency"])
        assert p["overall_throughput"] == pytest.approx((in_len + out_len) * bs / p["total_latency"])
    assert run["skipped_phases"] == []


def _profile(tmp_path, body: str):
    p = tmp_path / "p.toml"
    p.write_text('[dataset]\nkind = "random"\ninput_len = 4\noutput_len = 4\nnum_requests = 3\n' + body)
    return str(p)


def test_goodput_with_slo(tmp_path):
    from salactl.bench.job import BenchSettings, run_bench

    prof = _profile(tmp_path, '[[phases]]\nname = "g"\nmax_concurrency = 3\n')
    with FakeServer(0.05, 0.01) as srv:
        lax = run_bench(BenchSettings(profile=prof, endpoint=srv.url, flush_sleep=0.0, slo="ttft=1000",
                                      out=tmp_path / "a")).to_dict()["phases"][0]
        strict = run_bench(BenchSettings(profile=prof, endpoint=srv.url, flush_sleep=0.0,
                                         slo="ttft=1000,tpot=2", out=tmp_path / "b")).to_dict()["phases"][0]
    assert lax["request_goodput"] == pytest.approx(lax["request_throughput"])      # all 3 good
    assert strict["request_goodput"] == 0.0                                         # TPOT 10 ms > 2 ms
    assert strict["slo"] == {"ttft": 1000.0, "tpot": 2.0} and strict["knobs"]["slo_ms"]["tpot"] == 2.0


def test_failed_warmup_stops_with_no_files(tmp_path):
    from salactl.bench.job import BenchSettings, run_bench

    prof = _profile(tmp_path, '[[phases]]\nname = "w"\n')
    with FakeServer(0.01, 0.001) as srv:
        # the server answers 404 under this prefix: reachable, but it cannot generate
        with pytest.raises(EndpointError, match="warmup request of phase w failed \\(HTTP 404"):
            run_bench(BenchSettings(profile=prof, endpoint=srv.url + "/nothing", flush_sleep=0.0,
                                    out=tmp_path / "o"))
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("backend", ["sglang", "openai"])
def test_a_stream_cut_before_done_fails_the_request(backend):

    with FakeServer(0.01, 0.001) as srv:
        srv.cut_after = 1
        with HttpTarget(srv.url, backend, flush_sleep_s=0.0) as target:
            target.check()
            res = run_request(target, random_lengths(1, 4, 8, 1000)[0], 8, "P", threading.Event())
    assert not res.success and "without data: [DONE]" in res.error, res.error


def test_failed_requests_are_summarised_on_stderr(tmp_path, capfd):
    from salactl.bench.job import BenchSettings, run_bench

    prof = _profile(tmp_path, '[[phases]]\nname = "f"\nwarmup_requests = 0\n')
    with FakeServer(0.01, 0.001) as srv:
        srv.reject = lambda nth, body: (500, {"error": "boom"}) if nth <= 2 else None
        phase = run_bench(BenchSettings(profile=prof, endpoint=srv.url, flush_sleep=0.0,
                                        out=tmp_path / "o")).to_dict()["phases"][0]
    assert phase["failed"] == 2 and phase["completed"] == 1
    err = capfd.readouterr().err
    assert ('warning: phase f: 2 of 3 requests failed (2x: HTTP 500 Internal Server Error: {"error": "boom"} '
            f'(POST {srv.url}/generate))') in err
    assert "--details writes each request's error" in err


def test_the_deadline_leaves_a_socket_the_response_closed_alone():
    """Python 3.12.x/3.13 close the socket as a response's body ends; the next read's arm must not
    raise EBADF (it did, failing every probe there)."""
    import socket

    from salactl.bench.targets.http import Deadline

    s = socket.socket()
    s.close()
    Deadline(5.0).arm(s)
    Deadline(None).arm(s)


def test_a_request_cut_midway_has_no_timings_in_the_details_csv():
    """A failed request's row leaves TTFT, E2E and ITL blank alike: its partial ITL would pool into a
    distribution the record (which leaves failed requests out) does not have."""
    from salactl.bench.records import DETAIL_COLUMNS, detail_rows

    with FakeServer(0.01, 0.001) as srv:
        srv.cut_after = 3
        with HttpTarget(srv.url, "sglang", flush_sleep_s=0.0, read_timeout_s=10.0) as target:
            target.check()
            res = run_request(target, random_lengths(1, 4, 8, 1000)[0], 8, "P", threading.Event())
    assert not res.success and res.itl, (res.error, res.itl)
    row = dict(zip(DETAIL_COLUMNS, detail_rows("r", [res], res.start_time)[0]))
    assert (row["ttft_ms"], row["e2e_ms"], row["itl_ms"]) == ("", "", "")

"""--request-timeout and the side calls' cap bound the response-header phase too (a real loopback
server writing exact bytes): endless `100 Continue` interim answers, or a status line or headers
trickled a byte at a time, end at the deadline like a stalled body does; a fast answer is untouched
and no watchdog thread outlives its target. Also: a data line nested too deep to decode."""

import re
import threading
import time

import pytest

from test_cli_bench import _random_profile, salactl
from test_http_target_edges import Wire, _events, _one, _stream_route, chunked, sse
from salactl.bench.targets.http import HttpTarget
from salactl.errors import EndpointError

pytestmark = pytest.mark.usefixtures("quick_thread_switches")

GAP = 0.1           # between the pieces of a stalling answer
PIECES = 300        # 30 s of stalling, then the server closes: a client without the deadline waits it out
WITHIN = 10.0       # s past the deadline a stalled answer must end by: room for a stall of a loaded CI machine


def continue_flood(body):
    for _ in range(PIECES):
        yield b"HTTP/1.1 100 Continue\r\n\r\n"


def trickled_status(body):
    for _ in range(PIECES):
        yield b"H"


def trickled_header(body):
    yield b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
    for _ in range(PIECES):
        yield b"X"


STALLS = [continue_flood, trickled_status, trickled_header]
REQUEST_TIMEOUT = ("no complete answer within 0.5 s (--request-timeout, the total time one request "
                   "may take)")


def _watchdogs() -> set:
    # those of targets other tests left unclosed are not this test's
    return {t for t in threading.enumerate() if t.name == "salactl-http-watchdog"}


@pytest.fixture
def no_watchdog_left():
    before = _watchdogs()
    yield
    assert not _watchdogs() - before


@pytest.mark.parametrize("stall", STALLS)
def test_a_stalled_response_header_fails_the_request_at_the_request_timeout(stall, no_watchdog_left):
    with Wire(_stream_route("openai", stall), gap=GAP) as srv:
        t = time.perf_counter()
        res = _one(srv.url, read_timeout_s=0.5)
        took = time.perf_counter() - t
    assert 0.5 <= took < 0.5 + WITHIN, took
    assert not res.success and res.error == REQUEST_TIMEOUT


@pytest.mark.parametrize("stall", STALLS)
def test_a_stalled_probe_header_fails_the_probe_at_its_cap(stall, no_watchdog_left):
    with Wire({("GET", "/v1/models"): stall}, gap=GAP) as srv:
        t = time.perf_counter()
        with HttpTarget(srv.url, "openai", read_timeout_s=0.4) as target, pytest.raises(EndpointError) as e:
            target.check()
        took = time.perf_counter() - t
    assert 0.4 <= took < 0.4 + WITHIN, took
    assert str(e.value) == (f"GET {srv.url}/v1/models did not answer within 0.4 s; check the server "
                            "(side requests wait min(30 s, --request-timeout))")


def test_a_fast_answer_is_untouched_and_leaves_no_watchdog_running(no_watchdog_left):
    with Wire(_stream_route("openai", lambda body: chunked(_events("openai") + [sse(b"[DONE]")]))) as srv:
        for _ in range(3):
            res = _one(srv.url, read_timeout_s=60.0)
            assert res.success and res.output_len == 5, res.error


@pytest.mark.parametrize("route, message", [
    (("GET", "/v1/models"), r"error: GET http://127\.0\.0\.1:\d+/v1/models did not answer within 1 s; check the "
                            r"server \(side requests wait min\(30 s, --request-timeout\)\)"),
    (("POST", "/v1/completions"), r"error: the warmup request of phase A failed \(no complete answer within 1 s "
                                  r"\(--request-timeout, the total time one request may take\)\); the target "
                                  r"cannot serve this workload")])
def test_bench_exits_8_at_the_request_timeout_on_a_continue_flood(tmp_path, route, message):
    # timed by the tests above: a loaded machine's start-up of the CLI alone can take 10 s
    with Wire({route: continue_flood}, gap=GAP) as srv:
        r = salactl("bench", "--profile", _random_profile(tmp_path), "--endpoint", srv.url, "--backend", "vllm",
                    "--model", "m", "--flush-sleep", "0", "--request-timeout", "1", "--out", str(tmp_path / "o"),
                    timeout=120)
    assert r.returncode == 8 and re.fullmatch(message + "\n", r.stderr), r.stderr


def test_a_data_line_nested_too_deep_to_decode_is_not_json():
    deep = b"[" * 200_000
    with Wire(_stream_route("openai", lambda body: chunked([sse(deep)]))) as srv:
        res = _one(srv.url)
    assert not res.success
    assert res.error == f"the server streamed a line that is not JSON: {'[' * 100!r}"


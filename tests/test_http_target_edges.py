"""HTTP targets at the edges of the wire (a real loopback server writing exact bytes): side answers
past the 1 MiB cap, streams that end without `data: [DONE]` (a whole body counts, a cut one
fails), which usage counts as the server's, the client's own file-descriptor limit, credentials
in --endpoint and a --request-timeout too long for a socket timeout."""

import json
import socket
import socketserver
import subprocess
import sys
import threading
import time

import pytest

from bench_tokenizer import make_tokenizer
from salactl.bench.runner import run_request
from salactl.bench.synthetic import random_lengths
from salactl.bench.targets.http import Deadline, HttpTarget
from salactl.errors import EndpointError, UsageError
from salactl.runtime.tokenizer import Tokenizer
from test_cli_bench import _random_profile, salactl

N = 5
MiB = 2 ** 20

pytestmark = pytest.mark.usefixtures("quick_thread_switches")


def _json(obj) -> bytes:
    body = json.dumps(obj).encode()
    return b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body) + body


ROUTES = {("GET", "/health"): _json({}), ("GET", "/get_model_info"): _json({"model_path": "m"}),
          ("GET", "/v1/models"): _json({"object": "list", "data": [{"id": "m"}]}),
          ("POST", "/flush_cache"): _json({}), ("POST", "/reset_prefix_cache"): _json({})}


class Wire(socketserver.ThreadingTCPServer):
    """Loopback server. `routes` maps (method, path) to the whole response: bytes, or a function of
    the request's JSON body returning an iterable of byte pieces, written in order with `gap` s
    between them; the connection closes after it (a close in mid-body is a cut one)."""

    daemon_threads = True

    def __init__(self, routes: dict, gap: float = 0.01):
        table = {**ROUTES, **routes}

        class Handler(socketserver.StreamRequestHandler):
            def handle(self):
                method, path, _ = self.rfile.readline().decode().split(" ", 2)
                length = 0
                while (line := self.rfile.readline()) not in (b"\r\n", b""):
                    name, _, value = line.decode().partition(":")
                    length = int(value) if name.lower() == "content-length" else length
                body = json.loads(self.rfile.read(length) or b"{}")
                reply = table.get((method, path), b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n")
                try:
                    for piece in [reply] if isinstance(reply, bytes) else reply(body):
                        self.wfile.write(piece)
                        time.sleep(gap)
                except OSError:
                    pass

        super().__init__(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server_address[1]}"
        threading.Thread(target=self.serve_forever, daemon=True).start()

    def __exit__(self, *exc) -> None:
        self.shutdown()
        super().__exit__(*exc)


def _head(framing: bytes) -> bytes:
    return b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n" + framing + b"\r\n"


def chunked(events, last_chunk: bool = True):
    """Each event an HTTP chunk; the zero-length last chunk unless cut."""
    yield _head(b"Transfer-Encoding: chunked\r\n")
    for e in events:
        yield b"%x\r\n" % len(e) + e + b"\r\n"
    if last_chunk:
        yield b"0\r\n\r\n"


def sized(events, missing: int = 0):
    """A Content-Length body, `missing` bytes short of it when cut."""
    body = b"".join(events)
    yield _head(b"Content-Length: %d\r\n" % len(body))
    yield from events[:-1]
    yield events[-1][:len(events[-1]) - missing]


def closed(events):
    """No framing: the connection's close ends the body."""
    yield _head(b"Connection: close\r\n")
    yield from events


def sse(obj) -> bytes:
    return b"data: " + (obj if isinstance(obj, bytes) else json.dumps(obj).encode()) + b"\n\n"


def openai_chunk(text: str, usage: int | None = None) -> bytes:
    event = {"id": "c", "object": "text_completion", "choices": [{"index": 0, "text": text, "finish_reason": None}]}
    if usage is not None:
        event["usage"] = {"prompt_tokens": 4, "completion_tokens": usage, "total_tokens": 4 + usage}
    return sse(event)


def usage_only(n: int) -> bytes:
    return sse({"id": "c", "choices": [], "usage": {"prompt_tokens": 4, "completion_tokens": n, "total_tokens": 4 + n}})


def sglang_chunk(k: int) -> bytes:
    return sse({"text": "tok " * k, "meta_info": {"completion_tokens": k, "prompt_tokens": 4}})


def _stream_route(backend: str, script) -> dict:
    path = "/generate" if backend == "sglang" else "/v1/completions"
    return {("POST", path): script}


def _one(url: str, backend: str = "openai", n: int = N, **kw):
    with HttpTarget(url, backend, flush_sleep_s=0.0, **kw) as target:
        target.check()
        return run_request(target, random_lengths(1, 4, n, 1000)[0], n, "P", threading.Event())


# ---- A: side answers are capped at 1 MiB -------------------------------------------------------

def _endless(body):
    """An answer that never ends (bounded here at 64 MiB, so a client without the cap still stops)."""
    yield b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n\r\n"
    for _ in range(64):
        yield b"0" * MiB


@pytest.mark.parametrize("backend,path", [("sglang", "/health"), ("openai", "/v1/models")])
@pytest.mark.parametrize("answer", [_endless, _json({"data": [{"id": "m"}], "pad": "x" * (3 * MiB)})],
                         ids=["endless", "3MiB"])
def test_a_probe_answer_past_1_mib_is_an_endpoint_error(backend, path, answer):
    with Wire({("GET", path): answer}, gap=0) as srv:
        t = time.perf_counter()
        with HttpTarget(srv.url, backend, flush_sleep_s=0.0) as target, pytest.raises(EndpointError) as e:
            target.check()
    assert str(e.value) == (f"GET {srv.url}{path} answered with more than 1 MiB (the cap on a probe's or cache "
                            "flush's answer); check --endpoint and the server")
    assert time.perf_counter() - t < 5.0


def test_an_endless_flush_answer_is_a_flush_warning(capfd):
    with Wire({("POST", "/flush_cache"): _endless}, gap=0) as srv:
        with HttpTarget(srv.url, "sglang", flush_sleep_s=0.0) as target:
            assert target.flush_cache() is False
    err = capfd.readouterr().err
    assert err == (f"warning: the prefix cache was not flushed: POST {srv.url}/flush_cache answered with more "
                   "than 1 MiB (the cap on a probe's or cache flush's answer); check --endpoint and the server\n")


def test_bench_stops_with_exit_8_on_an_endless_probe_answer(tmp_path):
    with Wire({("GET", "/v1/models"): _endless}, gap=0) as srv:
        r = salactl("bench", "--profile", _random_profile(tmp_path), "--endpoint", srv.url, "--backend", "vllm",
                    "--flush-sleep", "0", "--out", str(tmp_path / "o"), timeout=120)
    assert r.returncode == 8 and r.stderr.count("\n") == 1, r.stderr
    assert f"GET {srv.url}/v1/models answered with more than 1 MiB" in r.stderr
    assert not (tmp_path / "o").exists()


# ---- B: a whole body without [DONE] is a finished request, a cut one fails ---------------------

def _events(backend: str) -> list[bytes]:
    if backend == "sglang":
        return [sglang_chunk(k) for k in range(1, N + 1)]
    return [openai_chunk("tok ", k) for k in range(1, N + 1)]


@pytest.mark.parametrize("backend", ["openai", "sglang"])
@pytest.mark.parametrize("framing", [chunked, sized])
def test_a_whole_body_without_done_is_a_finished_request(backend, framing):
    with Wire(_stream_route(backend, lambda body: framing(_events(backend)))) as srv:
        res = _one(srv.url, backend)
    assert res.success and res.output_len == N and res.output_len_source == "usage", res.error
    assert len(res.itl) == N - 1


@pytest.mark.parametrize("backend", ["openai", "sglang"])
@pytest.mark.parametrize("cut,done", [(lambda ev: chunked(ev, last_chunk=False), N),
                                      (lambda ev: sized(ev, missing=3), N - 1),    # the last event cut in half
                                      (closed, N)],
                         ids=["chunked-without-last-chunk", "short-of-content-length", "close-delimited"])
def test_a_body_cut_before_done_fails_the_request(backend, cut, done):
    with Wire(_stream_route(backend, lambda body: cut(_events(backend)))) as srv:
        res = _one(srv.url, backend)
    assert not res.success and res.error == (f"the stream ended after {done} tokens without data: [DONE] "
                                             "(the server closed the connection mid-response)"), res.error


# ---- C: usage counts only as the server's once output began; its last report is the total ------

@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    return Tokenizer(make_tokenizer(tmp_path_factory.mktemp("tok")))


ROLE_FRAME = openai_chunk("", usage=0)          # a first frame with the role only, and usage 0


@pytest.mark.parametrize("with_tokenizer", [False, True])
def test_a_first_frames_zero_usage_does_not_make_the_chunk_count_the_servers(with_tokenizer, tok):
    events = [ROLE_FRAME] + [openai_chunk(" the") for _ in range(N)] + [sse(b"[DONE]")]
    with Wire(_stream_route("openai", lambda body: chunked(events))) as srv:
        res = _one(srv.url, tokenizer=tok if with_tokenizer else None)
    assert res.success and res.output_len == N and not res.short
    assert res.output_len_source == ("tokenizer" if with_tokenizer else "chunks")


@pytest.mark.parametrize("final", [3, 7])
def test_the_servers_final_usage_is_the_total_even_below_the_chunk_count(final):
    events = [ROLE_FRAME] + [openai_chunk("tok ") for _ in range(N)] + [usage_only(final), sse(b"[DONE]")]
    with Wire(_stream_route("openai", lambda body: chunked(events))) as srv:
        res = _one(srv.url, n=8)
    assert res.success and res.output_len == final and res.output_len_source == "usage"
    assert len(res.itl) == final - 1 and res.short         # the server said it stopped short of 8
    assert res.ttft > 0 and all(gap > 0 for gap in res.itl)


def test_a_final_usage_of_0_after_text_fails_the_request():
    events = [openai_chunk("tok ") for _ in range(N)] + [usage_only(0), sse(b"[DONE]")]
    with Wire(_stream_route("openai", lambda body: chunked(events))) as srv:
        res = _one(srv.url)
    assert not res.success and res.error == ("the stream ended without any token: usage.completion_tokens "
                                             "stayed 0 although choices[0].text arrived")


# ---- D: the client's own file-descriptor limit is this machine's, not the server's -------------

EMFILE_SCRIPT = """
import json, os, resource, sys, threading
from salactl.bench.runner import run_request, warmup
from salactl.bench.synthetic import random_lengths
from salactl.bench.targets.http import HttpTarget
from salactl.errors import SalactlError

target = HttpTarget(sys.argv[1], "openai", model="m", flush_sleep_s=0.0)
req = random_lengths(1, 4, 4, 1000)[0]
resource.setrlimit(resource.RLIMIT_NOFILE, (64, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
held = []
try:
    while True:
        held.append(os.open(os.devnull, os.O_RDONLY))
except OSError:
    pass
res = run_request(target, req, 4, "P", threading.Event())
out = {"error": res.error, "failure": type(res.failure).__name__}
for name, step in (("check", target.check), ("warmup", lambda: warmup(target, req, "P", threading.Event()))):
    try:
        step()
    except SalactlError as e:
        out[name] = [type(e).__name__, e.exit_code, str(e)]
print(json.dumps(out))
"""


@pytest.mark.skipif(sys.platform == "win32", reason="RLIMIT_NOFILE is POSIX")
def test_running_out_of_file_descriptors_is_this_machines_limit():
    with Wire(_stream_route("openai", lambda body: chunked(_events("openai")))) as srv:
        r = subprocess.run([sys.executable, "-c", EMFILE_SCRIPT, srv.url], capture_output=True, text=True,
                           timeout=120)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    why = f"cannot open a connection to {srv.url}: this machine ran out of file descriptors (ulimit -n 64); raise it"
    assert out["error"] == why and out["failure"] == "CapacityError"
    assert out["check"] == ["CapacityError", 11, why]
    assert out["warmup"] == ["CapacityError", 11, f"the warmup request of phase P failed: {why}"]


# ---- E: credentials in --endpoint are refused, not dropped ------------------------------------

CREDENTIALS = ("--endpoint carries credentials (user:password@host), which salactl does not send; drop them "
               "and set OPENAI_API_KEY to the server's API key (sent as Authorization: Bearer, what SGLang's "
               "and vLLM's --api-key check)")


@pytest.mark.parametrize("endpoint", ["http://user:s3cret@127.0.0.1:30000", "https://user@host", "user:s3cret@host:1",
                                      "http://user:s3cret@127.0.0.1:bad"])
def test_credentials_in_the_endpoint_are_a_usage_error(endpoint):
    with pytest.raises(UsageError) as e:
        HttpTarget(endpoint, "openai")
    assert str(e.value) == CREDENTIALS


def test_bench_refuses_credentials_in_the_endpoint_with_exit_2(tmp_path):
    with Wire({}) as srv:
        url = srv.url.replace("http://", "http://user:s3cret@")
        r = salactl("bench", "--profile", _random_profile(tmp_path), "--endpoint", url, "--backend", "vllm",
                    "--flush-sleep", "0", "--out", str(tmp_path / "o"), timeout=120)
    assert r.returncode == 2 and r.stderr == f"error: {CREDENTIALS}\n", r.stderr
    assert not (tmp_path / "o").exists()


# ---- F: a --request-timeout past what a socket timeout holds is clamped, not an overflow ------

@pytest.mark.parametrize("seconds", [1e10, 1e300, float("inf")])
def test_a_huge_request_timeout_serves_requests(seconds):
    with Wire(_stream_route("openai", lambda body: chunked(_events("openai") + [sse(b"[DONE]")]))) as srv:
        res = _one(srv.url, read_timeout_s=seconds)
    assert res.success and res.output_len == N, res.error
    a, b = socket.socketpair()
    with a, b:
        Deadline(seconds).arm(a)
        assert 0 < a.gettimeout() <= Deadline(seconds).seconds < seconds

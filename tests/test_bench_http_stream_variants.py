"""HTTP targets against streams real servers send but the happy path lacks (real loopback server
writing exact bytes): tokens whose text is "" (special tokens, partial UTF-8 characters), SSE lines
ending in a lone CR, bodies that are not SSE, flat error objects, an untrusted TLS certificate, and
a vLLM server behind the default sglang backend."""

import json
import ssl
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from bench_server import in_one_of_three_runs
from salactl.bench.runner import run_request
from salactl.bench.synthetic import random_lengths
from salactl.bench.targets.http import HttpTarget
from salactl.errors import EndpointError

GAP = 0.1           # seconds between tokens
N = 6

pytestmark = pytest.mark.usefixtures("quick_thread_switches")

# a self-signed certificate for IP 127.0.0.1, valid 2000-2100
CERT = """-----BEGIN CERTIFICATE-----
MIIBbDCCARKgAwIBAgIBATAKBggqhkjOPQQDAjAUMRIwEAYDVQQDDAkxMjcuMC4w
LjEwIBcNMDAwMTAxMDAwMDAwWhgPMjEwMDAxMDEwMDAwMDBaMBQxEjAQBgNVBAMM
CTEyNy4wLjAuMTBZMBMGByqGSM49AgEGCCqGSM49AwEHA0IABA5RCY8+LD+HYP3C
qdOTtqac8QhKCzsDHynvf8XBVpMVv1XJNwYrzfPSKoEUt/AFAZOxzpZQIdW70UR/
IwHMiWOjUzBRMA8GA1UdEwEB/wQFMAMBAf8wHQYDVR0OBBYEFMqzSnE5Jcry+IrV
V144F9zbby3rMA8GA1UdEQQIMAaHBH8AAAEwDgYDVR0PAQH/BAQDAgKEMAoGCCqG
SM49BAMCA0gAMEUCIG+sHtpBV7OH+Eayd10ZFOSeFLxu/L4cRhCsa6GW0FQAAiEA
lgElejoPE85xz7i+7j+IujtiDXHTV7W+3Fks92anAnk=
-----END CERTIFICATE-----
"""
KEY = """-----BEGIN PRIVATE KEY-----
MIGHAgEAMBMGByqGSM49AgEGCCqGSM49AwEHBG0wawIBAQQgeN80QiAgqE04Bjfi
OfsK8Hp6MLNdTzWrjKDH1jccliehRANCAAQOUQmPPiw/h2D9wqnTk7amnPEISgs7
Ax8p73/FwVaTFb9VyTcGK83z0iqBFLfwBQGTsc6WUCHVu9FEfyMBzIlj
-----END PRIVATE KEY-----
"""

MODELS = {"object": "list", "data": [{"id": "m", "object": "model"}]}


class RawServer:
    """Loopback server. GET answers from `routes` (path -> JSON; absent: 404). A POST to /generate or
    /v1/completions streams `script(body)`: (delay s, bytes) pairs, each bytes one HTTP chunk, which
    the client reads as one block."""

    def __init__(self, script, routes=None, tls: ssl.SSLContext | None = None):
        self.routes = {"/health": {}, "/v1/models": MODELS, "/get_model_info": {"model_path": "m"}}
        self.routes.update(routes or {})
        owner = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def _reply(self, status: int, obj) -> None:
                body = json.dumps(obj).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.send_header("Connection", "close")
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self):
                found = owner.routes.get(self.path)
                self._reply(200, found) if found is not None else self._reply(404, {"detail": "Not Found"})

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
                if self.path not in ("/generate", "/v1/completions"):
                    self._reply(404, {"detail": "Not Found"})
                    return
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Transfer-Encoding", "chunked")
                self.send_header("Connection", "close")
                self.end_headers()
                try:
                    for delay, data in script(body):
                        time.sleep(delay)
                        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
                        self.wfile.flush()
                    self.wfile.write(b"0\r\n\r\n")
                except (BrokenPipeError, ConnectionResetError):
                    pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        if tls is not None:
            self.httpd.socket = tls.wrap_socket(self.httpd.socket, server_side=True)
        scheme = "https" if tls is not None else "http"
        self.url = f"{scheme}://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def __enter__(self) -> "RawServer":
        return self

    def __exit__(self, *exc) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def _event(backend: str, text: str, n: int | None, choice: bool = True) -> dict:
    """Token n's event: SGLang's /generate (cumulative text), or an OpenAI completion chunk with
    per-chunk usage (n None: none)."""
    if backend == "sglang":
        return {"text": text, "index": 0, "meta_info": {"completion_tokens": n, "prompt_tokens": 4}}
    event = {"id": "c", "object": "text_completion", "model": "m",
             "choices": [{"index": 0, "text": text, "finish_reason": None}] if choice else []}
    if n is not None:
        event["usage"] = {"prompt_tokens": 4, "completion_tokens": n, "total_tokens": 4 + n}
    return event


def _sse(obj) -> bytes:
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


def _one(url: str, backend: str = "openai", n: int = N):
    with HttpTarget(url, backend, flush_sleep_s=0.0, read_timeout_s=10.0) as target:
        target.check()
        return run_request(target, random_lengths(1, 4, n, 1000)[0], n, "P", threading.Event())


def _on_time(res, n: int = N) -> None:
    """Token k reached the client k·GAP after the request: TTFT one GAP, one ITL entry per later token."""
    assert res.success and res.output_len == n, res.error
    assert 0.5 * GAP <= res.ttft < 1.6 * GAP, res.ttft
    assert len(res.itl) == n - 1 and all(0.5 * GAP <= x < 1.6 * GAP for x in res.itl), res.itl


def _one_on_time(url: str, backend: str = "openai"):
    """_one's request, on time; sent again while a stall of the machine (up to a second, on a loaded CI
    machine) made a token late, which upsets one request, where mistiming a token upsets every one."""
    def one_run():
        res = _one(url, backend)
        _on_time(res)
        return res
    return in_one_of_three_runs(one_run)


EMPTY = {1, 4}          # tokens streamed with text "" (the first among them: TTFT)


@pytest.mark.parametrize("backend", ["openai", "vllm", "sglang"])
def test_tokens_with_empty_text_are_timed_like_any_other(backend):
    """Both protocols time a token when its count rises, whatever its text."""
    def script(body):
        for k in range(1, N + 1):
            text = "" if k in EMPTY else "a" * k if backend == "sglang" else "a"
            yield GAP, _sse(_event(backend, text, k))
        yield 0, b"data: [DONE]\n\n"

    with RawServer(script) as srv:
        _one_on_time(srv.url, backend)


def test_a_stream_of_empty_texts_only_succeeds():
    """ignore_eos past EOS: every token a skipped special token, counted by usage."""
    def script(body):
        for k in range(1, N + 1):
            yield GAP, _sse(_event("openai", "", k))
        yield 0, _sse(_event("openai", "", N, choice=False)) + b"data: [DONE]\n\n"

    with RawServer(script) as srv:
        _one_on_time(srv.url)


@pytest.mark.parametrize("usage", ["final", "none"])
def test_without_per_chunk_usage_an_empty_text_chunk_is_no_token(usage):
    """TTFT runs to the first non-empty chunk (reference/benchmarks.md §3): a role-only frame sent at
    once and a closing "" with finish_reason carry no token, so neither times nor counts one."""
    def script(body):
        yield 0, _sse(_event("openai", "", None))
        for k in range(1, N + 1):
            yield GAP, _sse(_event("openai", "a", None))
        closing = _event("openai", "", None)
        closing["choices"][0]["finish_reason"] = "length"
        final = _sse(_event("openai", "", N, choice=False)) if usage == "final" else b""
        yield 0, _sse(closing) + final + b"data: [DONE]\n\n"

    with RawServer(script) as srv:
        res = _one_on_time(srv.url)
    assert res.output_len_source == ("usage" if usage == "final" else "chunks")
    assert res.output_len_over_max is None


@pytest.mark.parametrize("usage,why", [
    (False, "choices[0].text stayed empty and no event carried usage.completion_tokens"),
    (True, "choices[0].text stayed empty and usage.completion_tokens did not count up with it"),
])
def test_a_stream_of_empty_texts_without_per_chunk_usage_has_no_token(usage, why):
    def script(body):
        final = _sse(_event("openai", "", N, choice=False)) if usage else b""
        yield 0, _sse(_event("openai", "", None)) * N + final + b"data: [DONE]\n\n"

    with RawServer(script) as srv:
        res = _one(srv.url)
    assert res.error == f"the stream ended without any token: {why}"


def _blocks(first: bytes, between: bytes, last: bytes):
    """A script: token k's event as `first` + data line + `last` in one block per token; `between`
    opens every later block (what the line end left to the next block)."""
    def script(body):
        for k in range(1, N + 1):
            yield GAP, (between if k > 1 else first) + b"data: " + json.dumps(_event("openai", "a", k)).encode() + last
        yield 0, between + b"data: [DONE]" + last + last
    return script


@pytest.mark.parametrize("script", [
    _blocks(b"", b"", b"\r\r"),                 # lone CRs: line end, then the blank line
    _blocks(b"", b"\r", b"\r"),                 # the blank line's CR opens the next block
    _blocks(b"", b"\n\r\n", b"\r"),             # CRLF cut between CR and LF: one line end, not two
    _blocks(b": ping\r", b"\r: ping\r", b"\r"),  # comments end in lone CRs too
], ids=["lone-cr", "cr-at-block-end", "crlf-across-blocks", "comments"])
def test_sse_lines_may_end_in_a_lone_cr(script):
    """A line ends at its CR: the token is timed when its block arrives, not with the next one."""
    with RawServer(script) as srv:
        _one_on_time(srv.url)


def test_a_body_without_data_lines_says_so():
    def script(body):
        for k in range(1, N + 1):
            yield 0, json.dumps(_event("openai", "a", k)).encode() + b"\n"       # NDJSON

    with RawServer(script) as srv:
        res = _one(srv.url)
    assert not res.success
    assert res.error.startswith(f"the response had no SSE data: lines ({N} other non-empty line(s), the first "
                                "'{\"id\": \"c\""), res.error


@pytest.mark.parametrize("backend", ["openai", "sglang"])
def test_a_flat_error_object_mid_stream_fails_the_request(backend):
    """vLLM's ErrorResponse streamed as is: {"object": "error", "message": ...}."""
    def script(body):
        yield 0, _sse(_event(backend, "a", 1))
        yield 0, _sse({"object": "error", "message": "engine dead", "type": "InternalServerError", "code": 500})
        yield 0, b"data: [DONE]\n\n"

    with RawServer(script) as srv:
        res = _one(srv.url, backend)
    assert not res.success and res.error == "server error: engine dead"


@pytest.fixture
def tls(tmp_path):
    (tmp_path / "cert.pem").write_text(CERT)
    (tmp_path / "key.pem").write_text(KEY)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(tmp_path / "cert.pem", tmp_path / "key.pem")
    return ctx, tmp_path / "cert.pem"


def test_an_untrusted_certificate_says_so_and_ssl_cert_file_fixes_it(tls, monkeypatch):
    ctx, cert = tls
    monkeypatch.delenv("SSL_CERT_FILE", raising=False)
    with RawServer(lambda body: [], tls=ctx) as srv:
        with HttpTarget(srv.url, "sglang") as target, pytest.raises(EndpointError) as e:
            target.check()
        assert str(e.value) == (f"cannot reach {srv.url}: its TLS certificate is not trusted (self-signed "
                                "certificate); if a private CA signed it, set SSL_CERT_FILE to that CA's bundle")
        monkeypatch.setenv("SSL_CERT_FILE", str(cert))
        with HttpTarget(srv.url, "sglang") as target:
            target.check()
    assert target.model == "m"


def test_the_sglang_backend_against_a_vllm_server_says_pass_backend_vllm():
    """vLLM serves /health (the sglang probe) but neither /get_model_info nor /generate."""
    with RawServer(lambda body: [], routes={"/get_model_info": None}) as srv:
        for model in (None, "given"):
            with HttpTarget(srv.url, "sglang", model=model) as target, \
                    pytest.raises(EndpointError, match=r"this looks like an OpenAI-compatible \(vLLM\) server: "
                                                       r"pass --backend vllm$"):
                target.check()


def test_a_server_without_model_info_or_model_list_still_passes_the_sglang_probe():
    with RawServer(lambda body: [], routes={"/get_model_info": None, "/v1/models": None}) as srv, \
            HttpTarget(srv.url, "sglang") as target:
        target.check()
    assert target.model.startswith("sglang@127.0.0.1:")

"""The model name an --endpoint server reports (/v1/models data[0].id, /get_model_info model_path)
is recorded only when it is a non-empty string: a number, a list or a body nested past the JSON
parser's depth is an openai-protocol EndpointError (pass --model), as no name is, and on SGLang the
default sglang@host:port with a warning, so `report latency` reads every record bench writes."""

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from bench_server import FakeServer
from salactl.bench.targets.http import HttpTarget
from salactl.errors import EndpointError
from test_cli_bench import _random_profile, salactl

NOT_NAMES = [123, ["a"], {"name": "m"}, True, 1.5]
DEEP = b'{"data": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"


def _default(url: str) -> str:
    return "sglang@" + url.removeprefix("http://")


@pytest.mark.parametrize("name", [*NOT_NAMES, "", None])
@pytest.mark.parametrize("backend", ["openai", "vllm"])
def test_an_openai_server_without_a_string_model_id_needs_model(name, backend):
    with FakeServer(0.01, 0.001, model=name) as srv:
        with HttpTarget(srv.url, backend, flush_sleep_s=0.0) as target, \
                pytest.raises(EndpointError, match=r"/v1/models .*; pass --model with the served model name$"):
            target.check()


@pytest.mark.parametrize("name", NOT_NAMES)
def test_an_sglang_model_path_that_is_no_string_falls_back_with_a_warning(name, capfd):
    with FakeServer(0.01, 0.001, model=name) as srv, HttpTarget(srv.url, "sglang", flush_sleep_s=0.0) as target:
        target.check()
    assert target.model == _default(srv.url)
    err = capfd.readouterr().err
    assert err.startswith(f"warning: {srv.url}/get_model_info answered model_path = ") and err.count("\n") == 1, err
    assert f"not a model name; the records name the model {_default(srv.url)} (pass --model to name it)" in err


@pytest.mark.parametrize("name", ["", None])
def test_an_sglang_server_without_a_model_path_falls_back_silently(name, capfd):
    with FakeServer(0.01, 0.001, model=name) as srv, HttpTarget(srv.url, "sglang", flush_sleep_s=0.0) as target:
        target.check()
    assert target.model == _default(srv.url) and capfd.readouterr().err == ""


def test_a_string_name_and_an_explicit_model_are_kept(capfd):
    with FakeServer(0.01, 0.001, model="served") as srv:
        for backend in ("sglang", "openai"):
            with HttpTarget(srv.url, backend, flush_sleep_s=0.0) as target:
                target.check()
            assert target.model == "served"
    with FakeServer(0.01, 0.001, model=123) as srv:
        for backend in ("sglang", "openai"):
            with HttpTarget(srv.url, backend, model="mine", flush_sleep_s=0.0) as target:
                target.check()
            assert target.model == "mine"
    assert capfd.readouterr().err == ""


class RawServer:
    """Loopback server answering every GET with `body` (HTTP 200, JSON) and /generate with 404."""

    def __init__(self, body: bytes):
        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def __enter__(self) -> "RawServer":
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def test_a_body_nested_past_the_parsers_depth_is_no_name(capfd):
    with RawServer(DEEP) as srv:
        with HttpTarget(srv.url, "vllm", flush_sleep_s=0.0) as target, \
                pytest.raises(EndpointError, match="did not list a model; pass --model with the served model name$"):
            target.check()
    with RawServer(DEEP.replace(b'"data"', b'"model_path"')) as srv, \
            HttpTarget(srv.url, "sglang", flush_sleep_s=0.0) as target:
        target.check()
    assert target.model == _default(srv.url) and capfd.readouterr().err == ""


def test_bench_records_of_a_server_with_a_numeric_model_path_pass_report_latency(tmp_path):
    out = tmp_path / "o"
    with FakeServer(0.01, 0.001, model=123) as srv:
        r = salactl("bench", "--profile", _random_profile(tmp_path), "--phases", "A", "--endpoint", srv.url,
                    "--backend", "sglang", "--flush-sleep", "0", "--out", str(out), timeout=120)
        assert r.returncode == 0, r.stderr
        v = salactl("bench", "--profile", _random_profile(tmp_path), "--phases", "A", "--endpoint", srv.url,
                    "--backend", "vllm", "--flush-sleep", "0", "--out", str(tmp_path / "v"), timeout=120)
    assert v.returncode == 8 and "pass --model" in v.stderr and v.stderr.count("\n") == 1, v.stderr
    assert not (tmp_path / "v").exists()
    assert [json.loads(x)["model"] for x in (out / "records.jsonl").read_text().splitlines()] == [_default(srv.url)]
    rep = salactl("report", "latency", str(out / "records.jsonl"), timeout=120)
    assert rep.returncode == 0, rep.stderr

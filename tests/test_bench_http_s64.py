"""`bench --endpoint` against servers that redirect their side routes (a probe or cache flush
redirected is no answer: exit 8 naming the Location, or a flush warning), that name their model with
half a surrogate pair, and endpoints refused at the probe, which must not leave the target's watchdog
thread running in the Python API."""

import json
import threading

import pytest

from bench_server import FakeServer
from salactl.bench.job import BenchSettings, run_bench
from salactl.bench.targets.http import HttpTarget
from salactl.errors import EndpointError, TokenizerError
from test_cli_bench import _random_profile, salactl
from test_http_target_edges import Wire

pytestmark = pytest.mark.usefixtures("quick_thread_switches")


def _redirect(status: int, location: str) -> bytes:
    return (b"HTTP/1.1 %d Moved\r\nLocation: %s\r\nContent-Type: text/html\r\nContent-Length: 18\r\n\r\n"
            b"<html>moved</html>" % (status, location.encode()))


@pytest.mark.parametrize("backend,path", [("vllm", "/v1/models"), ("sglang", "/health")])
def test_a_redirected_probe_is_exit_8_naming_the_location(tmp_path, backend, path):
    with Wire({("GET", path): _redirect(301, f"https://example.com{path}")}) as srv:
        r = salactl("bench", "--profile", _random_profile(tmp_path), "--endpoint", srv.url, "--backend", backend,
                    "--flush-sleep", "0", "--out", str(tmp_path / "o"), "--json", timeout=120)
    assert r.returncode == 8 and r.stdout == "", r.stderr
    assert r.stderr == (f"error: GET {srv.url}{path} answered HTTP 301 Moved, redirected to "
                        f"https://example.com{path}: point --endpoint there\n")
    assert not (tmp_path / "o").exists()


def test_a_redirected_cache_flush_did_not_flush(capfd):
    with Wire({("POST", "/flush_cache"): _redirect(307, "/other/flush_cache")}) as srv:
        with HttpTarget(srv.url, "sglang", flush_sleep_s=0.0) as target:
            assert target.flush_cache() is False
    assert capfd.readouterr().err == (f"warning: the prefix cache was not flushed: POST {srv.url}/flush_cache "
                                      "answered HTTP 307 Moved, redirected to /other/flush_cache: point "
                                      "--endpoint there\n")


def _watchdogs() -> int:
    return sum(t.name == "salactl-http-watchdog" for t in threading.enumerate())


def test_an_endpoint_refused_at_the_probe_leaves_no_watchdog_thread(tmp_path):
    before = _watchdogs()
    unready = b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\n\r\n"
    with Wire({("GET", "/health"): unready}) as srv:
        for _ in range(3):          # a script retrying until the server is ready
            with pytest.raises(EndpointError, match="wait until the server is ready"):
                run_bench(BenchSettings(profile=_random_profile(tmp_path), endpoint=srv.url, flush_sleep=0.0,
                                        out=tmp_path / "o"))
    assert _watchdogs() == before


def test_soar_rows_without_a_tokenizer_leave_no_watchdog_thread(tmp_path):
    rows = tmp_path / "d.jsonl"
    rows.write_text(json.dumps({"question": "what is two and two", "model_response": "four, of course"}) + "\n")
    before = _watchdogs()
    with Wire({}) as srv:
        with pytest.raises(TokenizerError, match="pass --tokenizer"):
            run_bench(BenchSettings(dataset=str(rows), endpoint=srv.url, flush_sleep=0.0, out=tmp_path / "o"))
    assert _watchdogs() == before


# ---- a served model name that is no Unicode text (a JSON "\ud800" escape) is no name ----------

HALF_PAIRS = ["m\ud800x", "m\udcffx"]


@pytest.mark.parametrize("name", HALF_PAIRS)
def test_an_openai_model_id_with_half_a_surrogate_pair_needs_model(tmp_path, name):
    with FakeServer(0.01, 0.001, model=name) as srv:
        r = salactl("bench", "--profile", _random_profile(tmp_path), "--endpoint", srv.url, "--backend", "vllm",
                    "--flush-sleep", "0", "--out", str(tmp_path / "o"), timeout=120)
    assert r.returncode == 8, r.stderr      # was a UnicodeEncodeError traceback printing the table
    assert r.stderr == (f"error: {srv.url}/v1/models lists data[0].id = {json.dumps(name)}, not a model name; "
                        "pass --model with the served model name\n")


@pytest.mark.parametrize("name", HALF_PAIRS)
def test_an_sglang_model_path_with_half_a_surrogate_pair_falls_back_with_a_warning(name, capfd):
    with FakeServer(0.01, 0.001, model=name) as srv, HttpTarget(srv.url, "sglang", flush_sleep_s=0.0) as target:
        target.check()
    default = "sglang@" + srv.url.removeprefix("http://")
    assert target.model == default
    assert capfd.readouterr().err == (f"warning: {srv.url}/get_model_info answered model_path = {json.dumps(name)}, "
                                      f"not a model name; the records name the model {default} (pass --model "
                                      "to name it)\n")


@pytest.mark.parametrize("status,fix", [
    (429, "the server is rate limiting this client; retry when it admits requests"),
    (403, "pass the server's API key in OPENAI_API_KEY"),
    (400, "check --endpoint / --backend"),
])
def test_a_refused_model_listing_gets_the_fix_for_its_status(status, fix):
    answer = b"HTTP/1.1 %d Refused\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}" % status
    with Wire({("GET", "/v1/models"): answer}) as srv:
        with HttpTarget(srv.url, "vllm") as target, pytest.raises(EndpointError) as err:
            target.check()
    assert str(err.value) == f"{srv.url}/v1/models answered HTTP {status}: {{}}; {fix}"

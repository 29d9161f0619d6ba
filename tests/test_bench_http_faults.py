"""HTTP targets against servers that deviate from the happy path (real loopback server): no token
usage, usage only at the end, extra choices, estimates above max_tokens, streams without any
token, non-stream 200 answers, full API URLs as --endpoint, an API key the probe lacks or that
cannot be a header, and a server without /reset_prefix_cache."""

import re
import threading

import pytest

from bench_server import FakeServer, chunk_sizes
from bench_tokenizer import make_tokenizer
from salactl.bench.runner import run_request
from salactl.bench.synthetic import random_lengths
from salactl.bench.targets.http import HttpTarget
from salactl.errors import EndpointError, UsageError
from salactl.runtime.tokenizer import Tokenizer

N = 12


pytestmark = pytest.mark.usefixtures("quick_thread_switches")


def _one(target, n=N):
    return run_request(target, random_lengths(1, 4, n, 1000)[0], n, "P", threading.Event())


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    return Tokenizer(make_tokenizer(tmp_path_factory.mktemp("tok")))


def _openai_request(usage: str, tokenizer=None, **server):
    """One streamed request to a loopback OpenAI-style server that reports `usage` as asked."""
    with FakeServer(0.01, 0.001) as srv:
        srv.usage = usage
        for k, v in server.items():
            setattr(srv, k, v)
        with HttpTarget(srv.url, "openai", flush_sleep_s=0.0, tokenizer=tokenizer) as target:
            target.check()
            return _one(target)


def test_no_usage_counts_tokens_by_retokenizing_the_streamed_text(tok):
    res = _openai_request("none", tok, token_text=" the")
    assert len(tok.encode(" the" * N, add_special_tokens=False)) == N          # one token per streamed word
    assert res.success and res.output_len == N and res.output_len_estimated
    assert not res.short                                            # an exact re-tokenized count is not short


def test_no_usage_without_tokenizer_keeps_the_chunk_count_but_marks_it():
    res = _openai_request("none")
    assert res.success and res.output_len == len(chunk_sizes(N)) < N and res.output_len_source == "chunks"


def _with_choice_1(event):
    """Each step also streams choice 1 as its own chunk (n=2 style); it is not our request's output."""
    other = {**event, "choices": [{**event["choices"][0], "index": 1, "text": "zzz"}]}
    return [event, other]


def test_only_choice_0_counts_without_usage():
    res = _openai_request("none", edit_event=_with_choice_1)
    assert res.success and res.output_len == len(chunk_sizes(N)) and res.output_len_over_max is None
    assert len(res.itl) == res.output_len - 1


def test_an_estimate_above_max_tokens_is_capped_and_flagged(tok):
    res = _openai_request("none", tok, token_text=" the the")         # twice the tokens asked for
    assert res.success and res.output_len == N and res.output_len_source == "tokenizer"
    assert res.output_len_over_max == 2 * N


@pytest.mark.parametrize("backend,edit,why", [
    ("openai", lambda e: {**e, "usage": {**e["usage"], "completion_tokens": 0}},
     "usage.completion_tokens stayed 0 although choices[0].text arrived"),
    ("openai", lambda e: {**e, "choices": []}, "usage.completion_tokens counted up but no event had choices[0].text"),
    ("sglang", lambda e: {k: v for k, v in e.items() if k != "meta_info"},
     "no event carried meta_info.completion_tokens"),
])
def test_a_stream_without_tokens_says_which_field_was_missing(backend, edit, why):
    with FakeServer(0.01, 0.001) as srv, HttpTarget(srv.url, backend, model="m", flush_sleep_s=0.0) as target:
        srv.edit_event = edit
        res = _one(target, 4)
    assert not res.success and res.error == f"the stream ended without any token: {why}"


@pytest.mark.parametrize("value,what", [("sk-abc\r\n", "the control character '\\r'"), ("sk-\u00e9\u20ac", "'€'")])
def test_a_bad_api_key_is_a_usage_error_before_any_request(monkeypatch, value, what):
    monkeypatch.setenv("OPENAI_API_KEY", value)
    with FakeServer(0.01, 0.001) as srv:
        with pytest.raises(UsageError, match="^" + re.escape(f"OPENAI_API_KEY contains {what}")):
            HttpTarget(srv.url, "openai")
    assert srv.requests == [] and srv.side_posts == []


def test_final_usage_only_gives_the_exact_count():
    res = _openai_request("final")
    assert res.success and res.output_len == N and not res.output_len_estimated and not res.short


def test_no_usage_is_recorded_and_warned_per_phase(tmp_path, capfd):
    from salactl.bench.job import BenchSettings, run_bench

    prof = tmp_path / "p.toml"
    prof.write_text('[dataset]\nkind = "random"\ninput_len = 4\noutput_len = 6\nnum_requests = 3\n'
                    '[[phases]]\nname = "u"\n')
    with FakeServer(0.01, 0.001) as srv:
        srv.usage = "none"
        phase = run_bench(BenchSettings(profile=str(prof), endpoint=srv.url, backend="openai",
                                        flush_sleep=0.0, out=tmp_path / "o")).to_dict()["phases"][0]
    assert phase["completed"] == 3 and phase["output_len_estimated"] == 3 and phase["short_outputs"] == 0
    err = capfd.readouterr().err
    assert ("warning: phase u: the server reported no token usage for 3 of 3 requests; their output tokens "
            "were counted as one per streamed chunk") in err and "pass --tokenizer" in err


@pytest.mark.parametrize("respond,message", [
    (lambda body: {"error": {"message": "bad request: prompt too long"}}, "prompt too long"),
    (lambda body: {"object": "text_completion", "choices": [{"text": "hello there"}]}, "hello there"),
])
def test_a_200_that_is_not_an_event_stream_fails_with_its_body(respond, message):
    with FakeServer(0.01, 0.001) as srv:
        srv.respond = respond
        with HttpTarget(srv.url, "openai", flush_sleep_s=0.0) as target:
            target.check()
            res = _one(target)
    assert not res.success
    assert "HTTP 200 with Content-Type application/json, not an event stream" in res.error, res.error
    assert message in res.error and "closed the connection" not in res.error


@pytest.mark.parametrize("path,backend", [("/v1/completions", "openai"), ("/v1/chat/completions", "openai"),
                                          ("/generate", "sglang"), ("/v1/completions/", "openai")])
def test_a_full_api_url_as_endpoint_is_cut_to_the_server_root(path, backend, capfd):
    with FakeServer(0.01, 0.001) as srv:
        with HttpTarget(srv.url + path, backend, flush_sleep_s=0.0) as target:
            target.check()
            res = _one(target, 4)
    assert res.success and target.url == srv.url and target.model == "fake-model"
    err = capfd.readouterr().err
    assert f"note: --endpoint ends in {path.rstrip('/')}; using the server root {srv.url}" in err
    assert err.count("\n") == 1


def test_an_api_key_refusal_of_the_model_probe_names_the_status_and_body(monkeypatch):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    with FakeServer(0.01, 0.001) as srv:
        srv.api_key = "sekrit"
        with HttpTarget(srv.url, "openai") as target, \
                pytest.raises(EndpointError, match=r"/v1/models answered HTTP 401: .*invalid API key.*"
                                                   r"pass the server's API key in OPENAI_API_KEY$"):
            target.check()
        monkeypatch.setenv("OPENAI_API_KEY", "sekrit")
        with HttpTarget(srv.url, "openai", flush_sleep_s=0.0) as target:
            target.check()
            assert target.model == "fake-model" and _one(target, 4).success


def test_a_404_model_list_hints_at_model():
    with FakeServer(0.01, 0.001) as srv:
        with HttpTarget(srv.url + "/api", "openai") as target, \
                pytest.raises(EndpointError, match=r"/api/v1/models answered HTTP 404: .*pass --model with the served"):
            target.check()


def test_openai_backend_falls_back_to_sglang_flush_cache(capfd):
    with FakeServer(0.01, 0.001) as srv:
        srv.flush_routes = {"/flush_cache"}                 # SGLang: no /reset_prefix_cache
        with HttpTarget(srv.url, "openai", flush_sleep_s=0.0) as target:
            target.flush_cache()
            target.flush_cache()
    assert srv.side_posts == ["/reset_prefix_cache", "/flush_cache", "/flush_cache"]
    assert srv.flushes == 2 and "warning" not in capfd.readouterr().err


def test_a_server_with_neither_flush_route_is_warned_about_once(capfd):
    with FakeServer(0.01, 0.001) as srv:
        srv.flush_routes = set()
        with HttpTarget(srv.url, "openai", flush_sleep_s=0.0) as target:
            target.flush_cache()
            target.flush_cache()
    err = capfd.readouterr().err
    assert err.count("warning") == 1 and "/reset_prefix_cache and" in err and "/flush_cache answered HTTP 404" in err


def test_a_failed_flush_and_estimated_counts_reach_the_record_and_summary(tmp_path, tok, capfd):
    from salactl.bench.job import BenchSettings, run_bench

    prof = tmp_path / "p.toml"
    prof.write_text('[dataset]\nkind = "random"\ninput_len = 4\noutput_len = 6\nnum_requests = 2\n'
                    '[[phases]]\nname = "u"\n')
    with FakeServer(0.01, 0.001) as srv:
        srv.usage, srv.token_text, srv.flush_routes = "none", " the the", set()
        run = run_bench(BenchSettings(profile=str(prof), endpoint=srv.url, backend="openai",
                                      tokenizer=str(make_tokenizer(tmp_path / "tok")), flush_sleep=0.0,
                                      out=tmp_path / "o")).to_dict()
    phase = run["phases"][0]
    assert phase["knobs"]["flush_cache"] is True and phase["knobs"]["cache_flushed"] is False
    assert phase["output_len_source"] == "tokenizer" and phase["output_len_over_max"] == 2
    assert phase["total_output_tokens"] == 12
    md = open(run["files"]["summary_md"]).read()
    assert "phase u: output tokens counted by tokenizer (the server reported no usage); 2 requests capped" in md
    assert "phase u: the prefix cache was not flushed before it" in md
    err = capfd.readouterr().err
    assert ("phase u: 2 of 2 requests streamed more than max_tokens by the client's estimate (e.g. 12 "
            "tokenizer count for 6 asked); their counts were capped at max_tokens") in err


def test_the_default_request_timeout_outlasts_a_long_queue():
    # SGLang/vLLM send nothing while a request waits for a running slot: the idle timeout must
    # allow what their own clients do (6 h), not fail Smax requests queued past 10 min
    with FakeServer() as srv:
        with HttpTarget(srv.url, "sglang") as target:
            assert target.knobs()["request_timeout_s"] == 6 * 60 * 60

"""Non-ASCII text at the HTTP target's edges, against the real loopback server: an --endpoint path
with non-ASCII characters (sent percent-encoded, recorded as typed), a non-ASCII host (its IDNA
name, or a usage error where it has no clean one), and streamed text with lone surrogates (which
JSON escapes bring) re-tokenized for the output count."""

import itertools
import json
import threading

import pytest

from bench_server import FakeServer, chunk_sizes
from salactl.bench.runner import run_request
from salactl.bench.synthetic import random_lengths
from salactl.bench.targets.http import HttpTarget
from salactl.runtime.loader import EMBEDDED_DIR
from salactl.runtime.tokenizer import Tokenizer
from test_cli_bench import salactl

N = 12
PROFILE = ('[dataset]\nkind = "random"\ninput_len = 4\noutput_len = 4\nnum_requests = 1\n'
           '[[phases]]\nname = "M"\n')


@pytest.fixture(scope="module")
def tok():
    return Tokenizer(EMBEDDED_DIR)


def _bench(srv, tmp_path, endpoint: str, *args):
    prof = tmp_path / "p.toml"
    prof.write_text(PROFILE)
    return salactl("bench", "--profile", str(prof), "--endpoint", endpoint, "--flush-sleep", "0",
                   "--out", str(tmp_path / "o"), "--json", *args, timeout=180)


def _records(tmp_path) -> list[dict]:
    """The records file, read as strict UTF-8 JSON (a lone surrogate could not be encoded)."""
    text = (tmp_path / "o" / "records.jsonl").read_bytes().decode("utf-8")
    return [json.loads(line) for line in text.splitlines()]


@pytest.mark.parametrize("typed,backend,wire,root", [
    ("/ä", "sglang", "/%C3%A4", "/ä"),
    ("/ü/v1", "openai", "/%C3%BC", "/ü"),
    ("/%C3%A4", "sglang", "/%C3%A4", "/%C3%A4"),       # an escape typed is sent as typed, not re-escaped
])
def test_a_non_ascii_endpoint_path_is_sent_percent_encoded_and_recorded_as_typed(tmp_path, typed, backend,
                                                                                  wire, root):
    with FakeServer(0.01, 0.001) as srv:
        srv.prefix = wire                   # the server answers only below the encoded path
        r = _bench(srv, tmp_path, srv.url + typed, "--backend", backend)
        assert r.returncode == 0, r.stderr
        assert len(srv.requests) == 2       # the warmup and the measured request, both routed
    phase = json.loads(r.stdout)["phases"][0]
    assert phase["completed"] == 1 and phase["failed"] == 0
    assert [rec["knobs"]["target"]["endpoint"] for rec in _records(tmp_path)] == [srv.url + root]


def test_sub_delims_and_colons_in_a_path_go_out_as_typed():
    """Routes such as /models/m:predict or /deploy/llama@v2 must reach the server unescaped."""
    with FakeServer(0.01, 0.001) as srv:
        srv.prefix = "/x:y@z;a=b,c!$&'()*+"
        with HttpTarget(srv.url + srv.prefix, "openai", flush_sleep_s=0.0) as target:
            target.check()
            res = run_request(target, random_lengths(1, 4, N, 1000)[0], N, "P", threading.Event())
    assert res.success and res.output_len == N


def test_an_ascii_host_is_never_judged_by_idna():
    with HttpTarget("http://a..b:8000", "openai") as target:
        assert target.connect_host == "a..b"     # the connection says what is wrong


def test_a_percent_that_starts_no_escape_is_sent_as_25():
    with FakeServer(0.01, 0.001) as srv:
        srv.prefix = "/a%25zz"
        with HttpTarget(srv.url + "/a%zz", "openai", flush_sleep_s=0.0) as target:
            target.check()
            res = run_request(target, random_lengths(1, 4, N, 1000)[0], N, "P", threading.Event())
    assert res.success and res.output_len == N and target.url == srv.url + "/a%zz"


def test_a_non_ascii_host_is_dialled_by_its_idna_name_and_recorded_unencoded():
    with HttpTarget("http://Bücher.example:8000/v1", "openai") as target:
        assert target.connect_host == "xn--bcher-kva.example"
        assert target.knobs()["endpoint"] == "http://bücher.example:8000"


@pytest.mark.parametrize("host", [
    "straße.de",                    # IDNA 2003 would connect to strasse.de, another host
    "ä" * 64 + ".de",               # a label past DNS's 63 characters
])
def test_a_host_without_a_clean_idna_form_is_a_one_line_usage_error(tmp_path, host):
    r = salactl("bench", "--endpoint", f"http://{host}:8000", "--out", str(tmp_path / "o"), timeout=60)
    assert r.returncode == 2, r.stderr
    assert f"--endpoint host '{host}' has no clean IDNA (ASCII) form" in r.stderr
    assert "xn--" in r.stderr and r.stderr.strip().count("\n") == 0


def _texts(*texts):
    """An edit_event that streams the given choice texts in turn, one per chunk."""
    turn = itertools.cycle(texts)
    return lambda event: {**event, "choices": [{**event["choices"][0], "text": next(turn)}]}


@pytest.mark.parametrize("texts,expected", [
    (("a\ud83d",), "a\ufffd" * 9),                              # a lone half: U+FFFD
    (("\ud83d", "\ude00"), "\U0001f600" * 4 + "\ufffd"),         # a pair split across two chunks: joined
])
def test_streamed_lone_surrogates_are_repaired_before_re_tokenizing(tok, texts, expected):
    assert len(chunk_sizes(N)) == 9                         # the chunks `expected` is made of
    with FakeServer(0.01, 0.001) as srv:
        srv.usage, srv.edit_event = "none", _texts(*texts)
        with HttpTarget(srv.url, "openai", flush_sleep_s=0.0, tokenizer=tok) as target:
            target.check()
            res = run_request(target, random_lengths(1, 4, N, 1000)[0], N, "P", threading.Event())
    assert res.success and res.output_len_source == "tokenizer", res.error
    # the estimate is capped at N; the count it was capped from tells which text was tokenized
    assert res.output_len == N and res.output_len_over_max == len(tok.encode(expected, add_special_tokens=False))


def test_a_lone_surrogate_in_the_stream_is_counted_and_recorded_as_valid_utf8(tmp_path):
    with FakeServer(0.01, 0.001) as srv:
        srv.usage, srv.edit_event = "none", _texts("a\ud83d")
        r = _bench(srv, tmp_path, srv.url, "--backend", "openai", "--tokenizer", str(EMBEDDED_DIR))
    assert r.returncode == 0, r.stderr
    [record] = _records(tmp_path)
    assert record["completed"] == 1 and record["output_len_source"] == "tokenizer"
    assert "\\ud8" not in (tmp_path / "o" / "records.jsonl").read_text(encoding="utf-8")

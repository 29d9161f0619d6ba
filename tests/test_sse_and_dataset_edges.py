"""Edges of bench's inputs: SSE `data:` lines without the optional space, a dataset row whose
response is a single token (dropped, as SGLang's `output_len < 2` rule does), a phase's
range_ratio = 0 overriding the dataset's, and the SOAR bins being (lo, hi]."""

import json

import numpy as np
import pytest

from bench_tokenizer import make_tokenizer
from salactl.bench.datasets import SoarRow, soar_requests
from salactl.bench.plan import plan_phases
from salactl.bench.profiles import load_profile
from salactl.bench.synthetic import _bin_lengths
from salactl.bench.targets.http_protocol import iter_sse
from salactl.runtime.tokenizer import Tokenizer
from test_bench_http_stream_variants import GAP, N, RawServer, _event, _on_time, _one


def _reader(blocks):
    it = iter([*blocks, b""])
    return lambda: next(it)


def test_sse_data_lines_with_and_without_the_space_parse_alike():
    """The SSE spec makes the space after `data:` optional; servers that omit it are valid."""
    got = [d for d, _ in iter_sse(_reader([b'data:{"a":1}\n\n', b'data: {"a":1}\n\n', b"data:[DONE]\r\n\r\n"]))]
    assert got == ['{"a":1}', '{"a":1}', "[DONE]"]
    assert [json.loads(d) for d in got[:2]] == [{"a": 1}, {"a": 1}]


@pytest.mark.usefixtures("quick_thread_switches")
def test_a_server_streaming_data_without_the_space_is_timed_token_by_token():
    def script(body):
        for k in range(1, N + 1):
            yield GAP, b"data:" + json.dumps(_event("openai", "a", k)).encode() + b"\n\n"
        yield 0, b"data:[DONE]\n\n"

    with RawServer(script) as srv:
        _on_time(_one(srv.url))


def test_a_response_of_one_token_is_too_short(tmp_path):
    tok_dir = make_tokenizer(tmp_path / "tok")
    (tok_dir / "tokenizer_config.json").write_text(json.dumps({"add_bos_token": False}))   # no BOS to count
    tok = Tokenizer(tok_dir)
    prompt = "the quick brown fox"
    assert len(tok.encode(prompt)) >= 2 and len(tok.encode("x")) == 1 and len(tok.encode("dog")) == 2
    rows = [SoarRow(1, prompt, "x"), SoarRow(2, prompt, "dog")]
    reqs, too_short = soar_requests(rows, tok, seed=1)
    assert too_short == 1 and [(r.source_line, r.output_len) for r in reqs] == [(2, 2)]


def test_a_phase_range_ratio_of_zero_overrides_the_datasets(tmp_path):
    p = tmp_path / "exact.toml"
    p.write_text('name = "exact"\n[dataset]\nkind = "random"\ninput_len = 64\noutput_len = 16\nrange_ratio = 0.5\n'
                 '[[phases]]\nname = "exact"\nnum_requests = 20\nrange_ratio = 0\n'
                 '[[phases]]\nname = "spread"\nnum_requests = 20\n')
    profile = load_profile(str(p))
    exact, spread = plan_phases(profile, profile.phases, {}, {}, None, 1000, None, None)
    assert exact.dataset["range_ratio"] == 0 and spread.dataset["range_ratio"] == 0.5
    assert {(r.input_len, r.output_len) for r in exact.requests} == {(64, 16)}
    assert len({r.input_len for r in spread.requests}) > 1          # the dataset's 0.5 where unset


def test_soar_bins_are_open_below_and_closed_above():
    # one-token-wide bins: (7, 8] holds only 8, (8, 9] only 9, whatever the draw
    lengths = _bin_lengths(((7, 8, 0.5), (8, 9, 0.5)), 10, 1.0, np.random.default_rng(1))
    assert sorted(lengths) == [8] * 5 + [9] * 5

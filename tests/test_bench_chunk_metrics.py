"""Per-token metrics from an OpenAI-compatible server that streams several tokens per chunk without
per-chunk usage (real loopback server on a fixed schedule, sala-nano's tokenizer for estimates):
ITL one entry per token, the first chunk's tokens in the peak tok/s, and short answers caught by
the re-tokenized count."""

import json
import threading
import time
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from bench_server import FakeServer, in_one_of_three_runs
from salactl.bench.job import BenchSettings, run_bench
from salactl.bench.metrics import phase_metrics
from salactl.bench.profiles import Phase
from salactl.bench.runner import run_phase, run_request
from salactl.bench.synthetic import random_lengths
from salactl.bench.targets.http import HttpTarget
from salactl.runtime.loader import EMBEDDED_DIR
from salactl.runtime.tokenizer import Tokenizer

WORD = " the"           # one sala-nano token
TTFT, GAP = 0.2, 0.1    # s: the first chunk, then one chunk per GAP

pytestmark = pytest.mark.usefixtures("quick_thread_switches")


class ScheduleServer:
    """/v1/completions streams `sizes[i]` tokens at `at(i)` s after the request (TTFT + i·GAP), with
    usage per chunk ("continuous"), in one last chunk without choices ("final", vLLM), on a last
    choice-0 chunk with an empty text and a finish_reason ("final-on-choice", llama.cpp), on the
    last chunk with text ("last-text") or not at all ("none"); chunk i's text is words[i % len(words)] per token."""

    def __init__(self, sizes: list[int], usage: str, at=None, words=(WORD,)):
        owner = self
        self.at = at or (lambda i: TTFT + i * GAP)

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def do_GET(self):
                body = json.dumps({"data": [{"id": "m"}]}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_POST(self):
                t0 = time.perf_counter()
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Connection", "close")
                self.end_headers()
                done = 0
                for i, k in enumerate(sizes):
                    while (left := t0 + owner.at(i) - time.perf_counter()) > 0:
                        time.sleep(left)
                    done += k
                    event = {"choices": [{"index": 0, "text": words[i % len(words)] * k, "finish_reason": None}]}
                    if usage == "continuous" or (usage == "last-text" and i == len(sizes) - 1):
                        event["usage"] = {"prompt_tokens": 4, "completion_tokens": done}
                    self._send(event)
                if usage.startswith("final"):
                    on_choice = usage == "final-on-choice"
                    closing = [{"index": 0, "text": "", "finish_reason": "length"}] if on_choice else []
                    self._send({"choices": closing,
                                "usage": {"prompt_tokens": 4, "completion_tokens": done}})
                self.wfile.write(b"data: [DONE]\n\n")
                self.wfile.flush()

            def _send(self, event):
                self.wfile.write(b"data: " + json.dumps(event).encode() + b"\n\n")
                self.wfile.flush()

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture(scope="module")
def tok():
    return Tokenizer(EMBEDDED_DIR)


@contextmanager
def _target(url, tokenizer=None):
    with HttpTarget(url, "openai", flush_sleep_s=0.0, read_timeout_s=10.0, tokenizer=tokenizer) as target:
        target.check()
        yield target


def _one(url, n, tokenizer=None):
    req = random_lengths(1, 4, n, 1000)[0]
    with _target(url, tokenizer) as target:
        return run_request(target, req, n, "P", threading.Event())


@pytest.mark.parametrize("usage", ["final", "final-on-choice", "last-text", "none"])
def test_a_count_known_only_at_the_end_gives_one_itl_entry_per_token(usage, tok):
    """The prefill's token alone, then 4 tokens per chunk: 16 entries of GAP/4, not 4 of GAP."""
    sizes = [1, 4, 4, 4, 4]

    def one_run():
        with ScheduleServer(sizes, usage) as srv:
            res = _one(srv.url, sum(sizes), tok)
        assert res.success and res.output_len == 17, res.error
        assert res.output_len_source == ("tokenizer" if usage == "none" else "usage")
        assert 0.8 * TTFT <= res.ttft < TTFT + 0.5 * GAP, res.ttft
        assert len(res.itl) == 16 and all(0.8 * GAP / 4 <= x < 1.5 * GAP / 4 for x in res.itl), res.itl

    in_one_of_three_runs(one_run)       # a stall of the machine bunches one run's chunks


def test_an_estimate_below_the_chunk_count_still_gives_one_itl_entry_per_token(tok):
    """Chunks " t" and "he" re-tokenize as one token " the": 4 tokens over 8 chunks."""
    def one_run():
        with ScheduleServer([1] * 8, "none", words=(" t", "he")) as srv:
            res = _one(srv.url, 8, tok)
        assert res.success and res.output_len == 4 and res.output_len_source == "tokenizer"
        assert len(res.itl) == 3 and sum(res.itl) == pytest.approx(7 * GAP, rel=0.1), res.itl

    in_one_of_three_runs(one_run)


def test_four_tokens_in_every_chunk_gives_a_mean_itl_equal_to_tpot():
    """The reviewer's schedule (the first chunk has 4 tokens too): the client cannot see that, so
    the mean ITL is the TPOT (12 gaps of GAP over 15 tokens), not the chunk gap."""
    def one_run():
        with ScheduleServer([4] * 4, "final") as srv, _target(srv.url) as target:
            out = run_phase(target, Phase("P", warmup_requests=0, flush_cache=False),
                            random_lengths(2, 4, 16, 1000), seed=1)
        m = phase_metrics(out.results, out.duration)
        assert all(len(r.itl) == 15 for r in out.results)
        assert m["mean_itl_ms"] == pytest.approx(m["mean_tpot_ms"], rel=0.05)
        assert m["mean_itl_ms"] == pytest.approx(3 * GAP / 15 * 1e3, rel=0.15)

    in_one_of_three_runs(one_run)


def test_the_first_chunks_tokens_count_in_the_peak_tokens_per_second():
    """20 tokens in the first chunk at 0.2 s, then one each at 1.2, 1.3, 1.4 s: the fullest second
    holds 20 tokens, not 1."""
    at = lambda i: TTFT if i == 0 else 1.1 + i * GAP

    def one_run():
        with ScheduleServer([20, 1, 1, 1], "continuous", at) as srv, _target(srv.url) as target:
            out = run_phase(target, Phase("P", warmup_requests=0, flush_cache=False),
                            random_lengths(1, 4, 23, 1000), seed=1)
        m = phase_metrics(out.results, out.duration)
        assert m["completed"] == 1 and m["total_output_tokens"] == 23
        assert m["max_output_tokens_per_s"] == 20.0     # a stall of 0.8 s puts the first chunk in the next second

    in_one_of_three_runs(one_run)


SCORED = ('[dataset]\nkind = "random"\ninput_len = 4\noutput_len = 40\nnum_requests = 2\n'
          '[scoring]\nmethod = "soar"\nweights = { A = 1.0 }\n[[phases]]\nname = "A"\nmax_concurrency = 2\n')


def _scored_without_usage(tmp_path, stop_after):
    prof = tmp_path / "scored.toml"
    prof.write_text(SCORED)
    with FakeServer(0.01, 0.001) as srv:
        srv.usage, srv.token_text, srv.stop_after = "none", WORD, stop_after
        return run_bench(BenchSettings(profile=str(prof), endpoint=srv.url, backend="openai",
                                       tokenizer=str(EMBEDDED_DIR), flush_sleep=0.0, reference="A=1",
                                       out=tmp_path / "o")).to_dict()["phases"][0]


def test_a_short_answer_counted_by_the_tokenizer_is_warned_and_blocks_the_score(tmp_path, capfd):
    phase = _scored_without_usage(tmp_path, lambda n: n - 8)
    assert phase["output_len_source"] == "tokenizer" and phase["short_outputs"] == 2
    assert phase["score_tier"] is None and phase["score_error"] == "2 of 2 requests returned fewer tokens than requested"
    assert ("warning: phase A: 2 of 2 requests returned fewer tokens than requested (e.g. 32 of 40 by "
            "re-tokenizing the streamed text)") in capfd.readouterr().err


@pytest.mark.parametrize("missing", [0, 1])
def test_a_tokenizer_count_at_or_within_a_token_of_the_asked_length_is_not_short(tmp_path, capfd, missing):
    """Re-tokenizing may merge or split a token: max(1 token, 2%) below the asked length passes."""
    phase = _scored_without_usage(tmp_path, lambda n: n - missing)
    assert phase["output_len_source"] == "tokenizer" and phase["short_outputs"] == 0
    assert phase["score_tier"] > 0 and phase["score_error"] is None
    assert "fewer tokens" not in capfd.readouterr().err

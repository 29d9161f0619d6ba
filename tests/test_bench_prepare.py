"""run_phase lets the target prepare for the phase's concurrency and longest request after the
warmup and before the clock (the embedded GPU engine captures its decode CUDA graphs there; the
GPU test of that capture is in test_gpu_engine.py)."""

import threading

import pytest

from salactl.bench.profiles import Phase
from salactl.bench.requests import BenchRequest
from salactl.bench.runner import run_phase
from salactl.bench.targets.base import Chunk, Target


class RecordingTarget(Target):
    """Streams each request's tokens at once and logs the calls the runner makes."""

    kind = "embedded"

    def __init__(self):
        self.calls: list[tuple] = []
        self._lock = threading.Lock()

    def _log(self, *call):
        with self._lock:
            self.calls.append(call)

    def stream(self, request, max_tokens, cancel):
        self._log("stream", request.request_id, max_tokens)
        for n in range(1, max_tokens + 1):
            yield Chunk(0.0 + n, n)

    def prepare(self, max_concurrency, longest):
        self._log("prepare", max_concurrency, longest)

    def flush_cache(self):
        self._log("flush")
        return True

    def phase_begin(self):
        self._log("phase_begin")


def _requests(lens):
    return [BenchRequest(f"r{i}", i_len, o_len, prompt_ids=tuple(range(i_len))) for i, (i_len, o_len) in enumerate(lens)]


@pytest.mark.parametrize("concurrency,want", [(None, 4), (2, 2), (8, 4)])
def test_prepare_comes_after_the_warmup_and_before_the_clock(concurrency, want):
    target = RecordingTarget()
    reqs = _requests([(10, 3), (50, 7), (5, 2), (30, 30)])
    run_phase(target, Phase("P", max_concurrency=concurrency), reqs)
    names = [c[0] for c in target.calls]
    assert names[:4] == ["stream", "prepare", "flush", "phase_begin"]
    assert target.calls[1] == ("prepare", want, 60)        # 30 + 30 tokens is the longest request
    assert names.count("prepare") == 1 and names.count("stream") == 5


def test_prepare_runs_without_a_warmup_too():
    target = RecordingTarget()
    run_phase(target, Phase("P", warmup_requests=0, flush_cache=False), _requests([(4, 1)]))
    assert [c[0] for c in target.calls][:2] == ["prepare", "phase_begin"]

"""run_phase lets the target prepare for the phase's concurrency and the positions its decode steps
feed, after the warmup and before the clock (the embedded GPU engine captures its decode CUDA graphs there; the
GPU test of that capture is in test_gpu_engine.py)."""

import threading

import pytest
import torch

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

    def prepare(self, max_concurrency, first_position, last_position):
        self._log("prepare", max_concurrency, first_position, last_position)

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
    # decode feeds positions 5 (the 5-token prompt's first output token) to 58 (30 + 30 - 2)
    assert target.calls[1] == ("prepare", want, 5, 58)
    assert names.count("prepare") == 1 and names.count("stream") == 5


def test_prepare_runs_without_a_warmup_too():
    target = RecordingTarget()
    run_phase(target, Phase("P", warmup_requests=0, flush_cache=False), _requests([(4, 2)]))
    assert [c[0] for c in target.calls][:2] == ["prepare", "phase_begin"]


def test_a_phase_that_decodes_nothing_prepares_nothing():
    """One output token each (the prefill profile): no decode step runs, so nothing is built; the
    positions come from the requests that decode only."""
    target = RecordingTarget()
    run_phase(target, Phase("P", warmup_requests=0, flush_cache=False), _requests([(100, 1), (7, 1)]))
    assert "prepare" not in [c[0] for c in target.calls]
    target = RecordingTarget()
    run_phase(target, Phase("P", warmup_requests=0, flush_cache=False), _requests([(3, 1), (20, 2), (9, 4)]))
    assert target.calls[0] == ("prepare", 3, 9, 20)


class OutOfMemoryStepper:
    """A stepping engine whose graph capture runs out of GPU memory (torch's own error type)."""

    max_batch_size = 8

    def has_work(self):
        return False

    def prepare(self, rows, first_position, last_position):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")


def test_running_out_of_memory_while_preparing_is_a_capacity_error():
    """The embedded target's capture runs outside any request, so no request turns its OOM into the
    capacity error (exit 11) a lazy capture inside a step gave; prepare does."""
    from salactl.bench.targets.embedded import EmbeddedTarget
    from salactl.bench.targets.engine_driver import EngineDriver
    from salactl.errors import CapacityError

    target = EmbeddedTarget(EngineDriver(OutOfMemoryStepper()), "m", 512, torch.device("cpu"))
    try:
        with pytest.raises(CapacityError, match=r"decode CUDA-graph capture ran out of memory .*lower "
                                                r"--max-running-requests or --mem-fraction") as e:
            run_phase(target, Phase("P", warmup_requests=0), _requests([(4, 3)]))
    finally:
        target.close()
    assert e.value.exit_code == 11

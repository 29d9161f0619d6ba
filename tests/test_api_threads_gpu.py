"""One GPUEngine shared by several threads: each thread's generate() gets the tokens a serial run
gives, and a stream left half-read in one thread blocks no other. On the GPU where there is one,
else in Triton's interpreter on the CPU (tools/gpu_tests.py runs it in the GPU suite)."""

import importlib.util
import os
import sys
import threading

import pytest
import torch

from conftest import micro_model
from salactl.runtime.engine import Engine
from salactl.runtime.sampling import SamplingParams

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"     # before triton is first imported
DEV = "cuda" if torch.cuda.is_available() else "cpu"
pytestmark = [pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="GPUEngine needs triton"),
              # micro_model's topk 1 warns at every request, from every thread
              pytest.mark.filterwarnings("ignore::salactl.errors.ModelLimitWarning")]

PARAMS = SamplingParams(max_new_tokens=4, ignore_eos=True)
# one prompt of three chunk_size chunks; three requests for two running slots
PROMPTS = {"short": [5, 6, 7], "long": list(range(3, 13)), "other": [9, 8, 10, 11]}


def _gpu():
    from salactl.runtime.gpu.engine import GPUEngine

    return GPUEngine(micro_model().to(DEV), DEV, max_running_requests=2, chunk_size=4, kv_tokens=256)


def _idle(gpu) -> bool:
    sched = gpu.scheduler
    return (not gpu.requests and not sched.has_work() and sched.slots.free == sched.slots.total
            and sched.pages.free == sched.pages.total)


def _run_threads(targets: dict) -> dict:
    """Run each callable in its own thread, started together; {name: its return value or error}."""
    out, start = {}, threading.Barrier(len(targets))

    def run(name, target):
        start.wait()
        try:
            out[name] = target()
        except BaseException as e:  # noqa: BLE001  reported by the assertion, not lost in the thread
            out[name] = e

    threads = [threading.Thread(target=run, args=item) for item in targets.items()]
    switch = sys.getswitchinterval()
    sys.setswitchinterval(1e-4)            # hand the GIL over often, so the threads interleave
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
    finally:
        sys.setswitchinterval(switch)
    assert not any(t.is_alive() for t in threads), "a thread is stuck"
    return out


def test_threads_generating_at_once_get_the_serial_tokens():
    reference = Engine(micro_model())                    # unfused, and not the engine's model
    want = {k: reference.generate(p, PARAMS).output_token_ids for k, p in PROMPTS.items()}
    gpu = _gpu()
    got = _run_threads({k: (lambda p=p: gpu.generate(p, PARAMS).output_token_ids) for k, p in PROMPTS.items()})
    assert got == want
    assert _idle(gpu)


def test_a_stream_left_half_read_in_one_thread_blocks_no_other():
    gpu = _gpu()
    want = gpu.generate(PROMPTS["other"], PARAMS).output_token_ids
    first_read, other_done = threading.Event(), threading.Event()

    def read_one_then_wait():
        stream = gpu.stream(PROMPTS["short"], SamplingParams(max_new_tokens=50, ignore_eos=True))
        next(stream)
        first_read.set()
        assert other_done.wait(timeout=120)
        del stream                                       # abandoned: aborted and released
        return "dropped"

    def generate_meanwhile():
        try:
            assert first_read.wait(timeout=120)
            return gpu.generate(PROMPTS["other"], PARAMS).output_token_ids
        finally:
            other_done.set()

    got = _run_threads({"holder": read_one_then_wait, "generator": generate_meanwhile})
    assert got == {"holder": "dropped", "generator": want}
    assert _idle(gpu)

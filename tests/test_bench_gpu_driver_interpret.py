"""The embedded bench target over the continuous-batching GPUEngine (micro model, Triton's
interpreter on CPU): a request whose step fails is failed alone and frees its memory, so the
requests behind it still run. Skipped where triton is not installed (CI) and on CUDA machines."""

import os
import threading

import pytest
import torch

from conftest import micro_model

if torch.cuda.is_available():
    pytest.skip("CUDA present: the GPU tests cover the engine", allow_module_level=True)
os.environ["TRITON_INTERPRET"] = "1"     # must be set before triton is first imported
pytest.importorskip("triton")

from salactl.bench.targets.engine_driver import EngineDriver, GpuStepper  # noqa: E402
from salactl.runtime.gpu.engine import GPUEngine  # noqa: E402
from salactl.runtime.sampling import SamplingParams  # noqa: E402


def test_a_failing_request_fails_alone_and_frees_its_slot():
    model = micro_model()
    with torch.no_grad():
        model.model.embed_tokens.weight[99] = float("inf")     # NaN logits for prompts holding 99
    engine = GPUEngine(model, "cpu", max_running_requests=1, chunk_size=32, kv_tokens=256)
    driver = EngineDriver(GpuStepper(engine))
    params = SamplingParams(max_new_tokens=3, ignore_eos=True)
    try:
        with pytest.raises(Exception, match="NaN/Inf logits"):
            list(driver.submit([5, 99, 6], params, threading.Event()))
        good = [tok for tok, _ in driver.submit([5, 6, 7], params, threading.Event())]
    finally:
        driver.close()
    assert len(good) == 3
    assert (engine.scheduler.slots.free, engine.scheduler.pages.free) == (engine.plan.slots, engine.plan.pages)


def test_cancelled_request_is_aborted_and_frees_its_slot():
    engine = GPUEngine(micro_model(), "cpu", max_running_requests=1, chunk_size=32, kv_tokens=256)
    driver = EngineDriver(GpuStepper(engine))
    cancel = threading.Event()
    try:
        got = []
        for tok, _ in driver.submit([5, 6, 7], SamplingParams(max_new_tokens=200, ignore_eos=True), cancel):
            got.append(tok)
            if len(got) == 2:
                cancel.set()
        after = [tok for tok, _ in driver.submit([8, 9], SamplingParams(max_new_tokens=2, ignore_eos=True),
                                                 threading.Event())]
    finally:
        driver.close()
    assert 2 <= len(got) < 200 and len(after) == 2
    assert not engine.requests                          # the driver released both requests
    assert (engine.scheduler.slots.free, engine.scheduler.pages.free) == (engine.plan.slots, engine.plan.pages)


def test_prepare_goes_through_the_driver_and_captures_nothing_without_cuda_graphs():
    engine = GPUEngine(micro_model(), "cpu", max_running_requests=4, chunk_size=32, kv_tokens=256)
    driver = EngineDriver(GpuStepper(engine))
    try:
        driver.prepare(4, 3, 100)
        assert engine.capture_decode_graphs(4, 3, 100) == 0 and not engine.runner.graphs
        out = [tok for tok, _ in driver.submit([5, 6, 7], SamplingParams(max_new_tokens=2, ignore_eos=True),
                                               threading.Event())]
    finally:
        driver.close()
    assert len(out) == 2

"""The embedded target's engine driver over the real single-sequence Engine (tiny model, CPU):
same tokens as Engine.generate, FIFO order visible in timestamps, per-request failures."""

import threading

import pytest
import torch

from conftest import tiny_model
from salactl.bench.requests import BenchRequest
from salactl.bench.runner import run_request
from salactl.bench.targets.embedded import EmbeddedTarget
from salactl.bench.targets.engine_driver import EngineDriver, SerialStepper
from salactl.errors import UsageError
from salactl.runtime.engine import Engine
from salactl.runtime.sampling import SamplingParams


@pytest.fixture(scope="module")
def engine():
    torch.manual_seed(0)
    return Engine(tiny_model(), "cpu", chunk_size=16)


def collect(driver, prompt, n, out, key, cancel=None):
    try:
        out[key] = list(driver.submit(prompt, SamplingParams(max_new_tokens=n, ignore_eos=True),
                                      cancel or threading.Event()))
    except Exception as e:
        out[key] = e


def test_driver_matches_generate_and_serves_fifo(engine):
    driver = EngineDriver(SerialStepper(engine), 1)
    prompts = {"a": list(range(5, 15)), "b": list(range(40, 45)), "c": [7, 8, 9]}
    out = {}
    threads = [threading.Thread(target=collect, args=(driver, p, 3, out, k)) for k, p in prompts.items()]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    driver.close()
    for k, p in prompts.items():
        want = engine.generate(p, SamplingParams(max_new_tokens=3, ignore_eos=True)).output_token_ids
        assert [tok for tok, _ in out[k]] == want
    # one sequence at a time: the requests' token time spans do not overlap
    spans = sorted((v[0][1], v[-1][1]) for v in out.values())
    assert all(prev[1] <= nxt[0] for prev, nxt in zip(spans, spans[1:]))


def test_bad_request_fails_alone(engine):
    driver = EngineDriver(SerialStepper(engine), 1)
    target = EmbeddedTarget(driver, "tiny", engine.config.vocab_size, torch.device("cpu"))
    bad = BenchRequest("bad", 2, 3, (1, engine.config.vocab_size + 5))
    good = BenchRequest("good", 3, 3, (4, 5, 6))
    ev = threading.Event()
    r_bad, r_good = run_request(target, bad, 3, "P", ev), run_request(target, good, 3, "P", ev)
    target.close()
    assert not r_bad.success and "outside the vocabulary" in r_bad.error
    assert r_good.success and r_good.output_len == 3 and len(r_good.itl) == 2
    assert r_good.tpot == pytest.approx((r_good.latency - r_good.ttft) / 2)


def test_refused_request_queued_before_a_good_one_fails_alone(engine):
    stepper = SerialStepper(engine)
    bad = stepper.submit([1, engine.config.vocab_size + 5], SamplingParams(max_new_tokens=3))
    good = stepper.submit([4, 5, 6], SamplingParams(max_new_tokens=3, ignore_eos=True))
    events = []
    while stepper.has_work():
        events += stepper.step()
    assert [(rid, type(x)) for rid, x, _ in events if rid == bad] == [(bad, UsageError)]
    assert [x for rid, x, _ in events if rid == good] == engine.generate(
        [4, 5, 6], SamplingParams(max_new_tokens=3, ignore_eos=True)).output_token_ids
    assert stepper.is_finished(bad) and stepper.is_finished(good)


def test_cancelled_request_stops_early(engine):
    driver = EngineDriver(SerialStepper(engine), 1)
    cancel = threading.Event()
    got = []
    for tok, _ in driver.submit([3, 4, 5], SamplingParams(max_new_tokens=50, ignore_eos=True), cancel):
        got.append(tok)
        if len(got) == 2:
            cancel.set()
    driver.close()
    assert 2 <= len(got) < 50


def test_submit_after_close_fails_at_once(engine):
    driver = EngineDriver(SerialStepper(engine), 1)
    driver.close()
    with pytest.raises(RuntimeError, match="closed"):
        driver.submit([3, 4], SamplingParams(max_new_tokens=2), threading.Event())

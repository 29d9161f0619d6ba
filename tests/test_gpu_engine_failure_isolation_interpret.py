"""GPUEngine after a failed step (micro models, Triton's interpreter on CPU): an interrupted prefill
leaves nothing behind for the next request on its slot, a request whose logits are NaN/Inf fails
alone, and stop ids outside the vocabulary are refused. Skipped where triton is not installed (CI)
and on CUDA machines."""

import dataclasses
import os
import random

import pytest
import torch

from conftest import micro_model

if torch.cuda.is_available():
    pytest.skip("CUDA present: the GPU tests cover the engine", allow_module_level=True)
os.environ["TRITON_INTERPRET"] = "1"     # must be set before triton is first imported
pytest.importorskip("triton")

from salactl.errors import NumericsError, UsageError  # noqa: E402
from salactl.runtime.checkpoint import random_state_dict  # noqa: E402
from salactl.runtime.engine import Engine  # noqa: E402
from salactl.runtime.gpu.engine import GPUEngine  # noqa: E402
from salactl.runtime.loader import build_model  # noqa: E402
from salactl.runtime.sampling import SamplingParams  # noqa: E402


def topk_model():
    """micro_model with topk=3: selection keeps one block by its compressed-key score, so stale
    compressed keys change the output (with micro_model's topk=1 every kept block is forced)."""
    cfg = micro_model().config
    cfg = cfg.replace(sparse_config=dataclasses.replace(cfg.sparse_config, topk=3))
    return build_model(cfg, random_state_dict(cfg, "cpu", torch.float32, 5))


def interrupt_call(module, n: int):
    """Ctrl-C at the n-th call of `module` (a torch forward pre-hook, removed when it fires)."""
    calls = [0]

    def hook(_module, _args):
        calls[0] += 1
        if calls[0] == n:
            handle.remove()
            raise KeyboardInterrupt
    handle = module.register_forward_pre_hook(hook)


def prompt(rng, n):
    return [1] + [rng.randrange(5, 128) for _ in range(n - 1)]


def test_a_prefill_interrupted_midway_leaves_nothing_for_the_next_request_on_its_slot():
    """Ctrl-C in the lightning layer of A's second chunk: sparse layer 0 has compressed that chunk's
    windows, layer 2 has not. B then takes the same slot and must match the reference Engine (the
    dead request's window count once leaked into B's, so B's selection read stale keys: with
    these prompts that changed B's first token)."""
    rng = random.Random(3)
    a, b = prompt(rng, 72), prompt(rng, 72)
    params = SamplingParams(max_new_tokens=1, ignore_eos=True)
    want = Engine(topk_model()).generate(b, params).output_token_ids
    engine = GPUEngine(topk_model(), "cpu", max_running_requests=1, chunk_size=32, kv_tokens=512)
    interrupt_call(engine.model.model.layers[1].self_attn, 2)
    with pytest.raises(KeyboardInterrupt):
        engine.generate(a, params)
    assert not engine.requests
    assert (engine.scheduler.slots.free, engine.scheduler.pages.free) == (engine.plan.slots, engine.plan.pages)
    assert engine.generate(b, params).output_token_ids == want


def test_a_prefill_forward_that_raises_commits_no_compressed_windows():
    """The runner drops what the failed forward had recorded, so the next forward (another slot)
    does not mark the failed slot's windows as computed."""
    engine = GPUEngine(micro_model(), "cpu", max_running_requests=2, chunk_size=64, kv_tokens=256)
    for slot in (0, 1):
        engine.pools.assign_pages(slot, [4 * slot + i for i in range(4)])
    interrupt_call(engine.model.model.layers[1].self_attn, 1)
    with pytest.raises(KeyboardInterrupt):
        engine.runner.prefill([(0, list(range(5, 53)), 0)])
    engine.runner.prefill([(1, list(range(5, 53)), 0)])
    assert engine.backend.k1_have[:2] == [0, 11]          # 48 tokens: 11 full windows


def test_releasing_a_slot_mid_forward_drops_its_pending_windows():
    """release_slot forgets windows a forward recorded but has not committed for that slot."""
    engine = GPUEngine(micro_model(), "cpu", max_running_requests=1, chunk_size=64, kv_tokens=256)
    engine.pools.assign_pages(0, [0, 1, 2])
    engine.backend._layer_k1(0, 0, 48)
    engine.backend.release_slot(0)
    engine.backend.end_forward()
    assert engine.backend.k1_have[0] == 0


def test_an_interrupted_admission_fails_only_the_admitted_request(monkeypatch):
    """A step interrupted while it resets a newly admitted request's slot finishes that request
    as "error" and frees its memory (it never runs on a half-reset slot)."""
    engine = GPUEngine(micro_model(), "cpu", max_running_requests=1, chunk_size=32, kv_tokens=256)
    params = SamplingParams(max_new_tokens=2, ignore_eos=True)
    want = engine.generate([5, 6, 7], params).output_token_ids
    real = engine.pools.assign_pages

    def interrupted(slot, pages):
        monkeypatch.setattr(engine.pools, "assign_pages", real)
        raise KeyboardInterrupt
    monkeypatch.setattr(engine.pools, "assign_pages", interrupted)
    rid = engine.submit([5, 6, 7], params)
    with pytest.raises(KeyboardInterrupt):
        engine.step()
    assert engine.result(rid).finish_reason == "error"
    assert (engine.scheduler.slots.free, engine.scheduler.pages.free) == (engine.plan.slots, engine.plan.pages)
    assert engine.generate([5, 6, 7], params).output_token_ids == want


def test_nan_logits_fail_only_their_request():
    """Three requests batched in every step; token `poison` has an inf embedding row, so one
    request's logits are NaN at prefill (its prompt holds it) and another's at its first decode
    step (it samples it first). Each alone finishes "error"; the healthy one runs on and matches
    the reference Engine, and events() raises the NumericsError once all have finished."""
    params = SamplingParams(max_new_tokens=4, ignore_eos=True)
    healthy, sick = [5, 6, 7], [9, 10, 11, 12]
    ref = Engine(micro_model())
    want = ref.generate(healthy, params).output_token_ids
    poison = ref.generate(sick, params).output_token_ids[0]
    assert poison not in want + healthy + sick
    model = micro_model()
    with torch.no_grad():
        model.model.embed_tokens.weight[poison] = float("inf")
    engine = GPUEngine(model, "cpu", max_running_requests=4, chunk_size=32, kv_tokens=256)
    rids = [engine.submit(p, params) for p in (healthy, sick, [5, poison, 6])]
    seen = []
    with pytest.raises(NumericsError, match="NaN/Inf logits"):
        for event in engine.events():
            seen.append(event)
    results = [engine.result(r) for r in rids]
    assert [[t for r, t, _ in seen if r == rid] for rid in rids] == [want, [poison], []]
    assert [(r.finish_reason, r.output_token_ids) for r in results] == [
        ("length", want), ("error", [poison]), ("error", [])]
    assert (engine.scheduler.slots.free, engine.scheduler.pages.free) == (engine.plan.slots, engine.plan.pages)


@pytest.mark.parametrize("where", ["stop_token_ids", "eos_ids", "engine eos_ids"])
def test_stop_ids_outside_the_vocabulary_are_refused(where):
    msg = r"stop token id 128 is outside the model's vocabulary \(0\.\.127\)"
    if where == "engine eos_ids":
        with pytest.raises(UsageError, match=msg):
            GPUEngine(micro_model(), "cpu", kv_tokens=256, eos_ids=(2, 128))
        return
    engine = GPUEngine(micro_model(), "cpu", kv_tokens=256)
    kw = {"params": SamplingParams(stop_token_ids=(3, 128))} if where == "stop_token_ids" else {"eos_ids": 128}
    with pytest.raises(UsageError, match=msg):
        engine.submit([5, 6], **kw)
    assert not engine.scheduler.has_work()


def test_generate_batch_keeps_the_healthy_results_of_a_batch_with_nan_logits():
    """generate_batch returns every result, the failed requests' with finish_reason "error" (a
    healthy one is never lost); only a batch in which every request failed raises."""
    params = SamplingParams(max_new_tokens=4, ignore_eos=True)
    healthy, sick = [5, 6, 7], [9, 10, 11, 12]
    ref = Engine(micro_model())
    want = ref.generate(healthy, params).output_token_ids
    poison = ref.generate(sick, params).output_token_ids[0]
    model = micro_model()
    with torch.no_grad():
        model.model.embed_tokens.weight[poison] = float("inf")
    engine = GPUEngine(model, "cpu", max_running_requests=4, chunk_size=32, kv_tokens=256)
    results = engine.generate_batch([(p, params) for p in (healthy, sick, [5, poison, 6])])
    assert [(r.finish_reason, r.output_token_ids) for r in results] == [
        ("length", want), ("error", [poison]), ("error", [])]
    with pytest.raises(NumericsError, match="NaN/Inf logits"):
        engine.generate_batch([(sick, params), ([poison], params)])
    assert not engine.requests
    assert (engine.scheduler.slots.free, engine.scheduler.pages.free) == (engine.plan.slots, engine.plan.pages)

"""GPUEngine's host logic on the CPU through Triton's interpreter (as test_gpu_interpret.py runs
it): finalizers that fire mid-step, requests whose logits processors ban every token, on_token's
stop against a later token's error, and argument checks. Skipped where triton is not installed
(CI) and on CUDA machines."""

import gc
import os

import pytest
import torch

from conftest import micro_model, topk_micro_model

if torch.cuda.is_available():
    pytest.skip("CUDA present: the GPU tests cover the engine", allow_module_level=True)
os.environ["TRITON_INTERPRET"] = "1"     # must be set before triton is first imported
pytest.importorskip("triton")

from salactl.errors import AllTokensBannedError, CapacityError, NumericsError, UsageError  # noqa: E402
from salactl.runtime.engine import Engine  # noqa: E402
from salactl.runtime.gpu.engine import GPUEngine  # noqa: E402
from salactl.runtime.sampling import SamplingParams, logits_processors, sample  # noqa: E402

THREE = SamplingParams(max_new_tokens=3, ignore_eos=True)


def _engine(**kw) -> GPUEngine:
    return GPUEngine(micro_model(), "cpu", **{"max_running_requests": 3, "chunk_size": 64, "kv_tokens": 1024, **kw})


def _memory(engine) -> tuple[int, int]:
    return engine.scheduler.pages.free, engine.scheduler.slots.free


def _cycle_held_stream(engine, prompt) -> int:
    """A stream only a reference cycle keeps alive (the next GC pass finalizes it); its rid."""
    holder = []
    holder += [holder, engine.stream(prompt, THREE)]
    return engine._next_id - 1


@pytest.mark.parametrize("trigger", ["gc_of_a_stream", "abort_from_a_finalizer"])
def test_a_request_ended_mid_step_ends_after_the_step_and_spares_the_others(trigger):
    """A GC pass inside the step's forward finalizes a stream, whose request (prefilled in the same
    chunk as another's) must not leave the scheduler's lists under the step: the other request's
    tokens stay those it gets alone, and the ended one is released once the step is over."""
    engine = _engine()
    want = engine.generate([5, 6, 7], THREE).output_token_ids
    before = _memory(engine)
    seen = []

    def end_once(_module, _args):
        if not seen:
            end()
            req = engine.requests[ended]
            seen.append((req.finish_reason, req in engine.scheduler.prefilling))

    handle = engine.model.model.embed_tokens.register_forward_pre_hook(end_once)
    gc.disable()                                # only the hook's pass collects the stream
    try:
        if trigger == "gc_of_a_stream":
            ended = _cycle_held_stream(engine, [9, 10, 11, 12])
            end = gc.collect
        else:
            ended = engine.submit([9, 10, 11, 12], THREE)
            end = lambda: engine.abort(ended)      # noqa: E731 - what a user's __del__ may call
        other = engine.submit([5, 6, 7], THREE)
        events = list(engine.events())
    finally:
        gc.enable()
        handle.remove()
    assert seen == [(None, True)]               # held back while the step ran
    assert [tok for rid, tok, _ in events if rid == other] == want
    res = engine.result(other)
    assert (res.output_token_ids, res.finish_reason) == (want, "length")
    if trigger == "abort_from_a_finalizer":
        assert engine.result(ended).finish_reason == "abort"
    assert not engine.requests and not engine.scheduler.has_work() and _memory(engine) == before


BANNING = SamplingParams(max_new_tokens=6, no_repeat_ngram_size=1, min_new_tokens=6)
EVERY_ID_BUT_THE_FIRST_THREE = list(range(3, 128))   # micro vocab 128: 0, 1 and EOS 2 are left


def test_a_request_whose_processors_ban_every_token_fails_alone():
    # dense_len 136: the 125-token prompt stays dense (sparse steps would only cost time here)
    engine = GPUEngine(topk_micro_model(), "cpu", max_running_requests=3, chunk_size=256,
                       kv_tokens=2048)
    good = ([5, 6, 7, 8], SamplingParams(max_new_tokens=6, ignore_eos=True))
    want = engine.generate(*good).output_token_ids
    banned, other = engine.submit(EVERY_ID_BUT_THE_FIRST_THREE, BANNING), engine.submit(*good)
    with pytest.raises(AllTokensBannedError) as err:
        list(engine.events())
    msg = str(err.value)
    assert "every token was banned" in msg and "output token 3" in msg and "NaN" not in msg
    assert "no_repeat_ngram_size (--no-repeat-ngram-size) 1" in msg and "min_new_tokens (--min-new-tokens) 6" in msg
    assert isinstance(err.value, UsageError) and not isinstance(err.value, NumericsError)
    assert err.value.exit_code != NumericsError.exit_code
    failed = engine.result(banned)
    assert (failed.finish_reason, len(failed.output_token_ids)) == ("error", 2)
    assert engine.result(other).output_token_ids == want


def test_the_cpu_engine_and_sample_say_banned_not_nan():
    with pytest.raises(AllTokensBannedError, match="every token was banned"):
        Engine(micro_model(), "cpu").generate(EVERY_ID_BUT_THE_FIRST_THREE, BANNING)
    processors = logits_processors(BANNING, [0, 1, 2], {2}, 3, torch.device("cpu"))
    with pytest.raises(AllTokensBannedError):
        sample(torch.zeros(3), BANNING, None, processors)
    with pytest.raises(NumericsError):           # NaN logits stay a NumericsError with processors on
        sample(torch.tensor([0.0, float("nan"), 0.0]), BANNING, None, processors)


def _poisoned_after_first_token(prompt, params):
    """The micro model with its first output token's embedding set to inf: the decode step that
    feeds it computes NaN logits."""
    first = Engine(micro_model()).generate(prompt, params).output_token_ids[0]
    model = micro_model()
    with torch.no_grad():
        model.model.embed_tokens.weight[first] = float("inf")
    return model, first


def test_on_tokens_stop_wins_over_the_error_of_a_token_sampled_after_it():
    """One step samples the first token (prefill) and fails the second (decode, NaN); on_token asks
    to stop at the first, so the result is Engine's: "stop" with that token, nothing raised."""
    prompt, params = [9, 10, 11, 12], SamplingParams(max_new_tokens=4, ignore_eos=True)
    model, first = _poisoned_after_first_token(prompt, params)
    engine = GPUEngine(model, "cpu", max_running_requests=1, chunk_size=32, kv_tokens=256)
    res = engine.generate(prompt, params, on_token=lambda _tok: True)
    assert (res.finish_reason, res.output_token_ids) == ("stop", [first])
    assert list(engine.events()) == [] and not engine.requests


@pytest.mark.parametrize("kw, name", [({"on_token": 5}, "on_token"), ({"prefill_progress": "yes"}, "prefill_progress")])
def test_generate_refuses_a_callback_that_is_not_callable_before_any_work(kw, name):
    engine = _engine()
    with pytest.raises(UsageError, match=f"^{name} must be a function or None"):
        engine.generate([5, 6, 7], THREE, **kw)
    assert engine._next_id == 0 and not engine.scheduler.has_work()


@pytest.mark.parametrize("kw, words", [
    ({"chunk_size": 1.5}, "chunk_size (--chunk-size) must be a positive integer"),
    ({"chunk_size": "64"}, "chunk_size (--chunk-size) must be a positive integer"),
    ({"max_running_requests": 2.5}, "max_running_requests (--max-running-requests) must be a positive integer"),
    ({"max_running_requests": True}, "max_running_requests (--max-running-requests) must be a positive integer"),
    ({"kv_tokens": 0}, "kv_tokens must be a positive integer or None"),
    ({"kv_tokens": 100.5}, "kv_tokens must be a positive integer or None"),
    ({"max_context": 0}, "max_context must be a positive integer or None"),
    ({"mem_fraction": "0.5"}, "mem_fraction (--mem-fraction) must be a number"),
    ({"mem_fraction": 0}, "mem_fraction (--mem-fraction) must be in (0, 1]"),
    ({"mem_fraction": 1.5}, "mem_fraction (--mem-fraction) must be in (0, 1]"),
    ({"mem_fraction": float("nan")}, "mem_fraction (--mem-fraction) must be in (0, 1]"),
])
def test_the_constructor_refuses_bad_sizes_naming_the_argument(kw, words):
    model = micro_model()
    with pytest.raises(UsageError) as err:
        GPUEngine(model, "cpu", **{"max_running_requests": 2, "chunk_size": 32, "kv_tokens": 512, **kw})
    assert str(err.value).startswith(words)
    assert type(model.model.layers[0].self_attn) is type(micro_model().model.layers[0].self_attn)   # not fused


@pytest.mark.parametrize("kw, words", [
    ({"kv_tokens": 10 ** 9}, "a KV cache of 1000000000 tokens needs"),
    ({"max_running_requests": 10 ** 7}, "a KV cache of 512 tokens needs"),      # the GLA state slots take it all
])
def test_a_cache_that_cannot_fit_is_refused_before_the_model_is_fused(kw, words):
    model = micro_model()
    with pytest.raises(CapacityError, match=f"^{words}"):
        GPUEngine(model, "cpu", **{"max_running_requests": 2, "chunk_size": 32, "kv_tokens": 512, **kw})
    assert type(model.model.layers[0].self_attn) is type(micro_model().model.layers[0].self_attn)   # not fused


@pytest.mark.parametrize("item, what", [([5, 6, 7], "list of length 3"), (([5, 6, 7],), "tuple of length 1"),
                                        (7, "int")])
def test_generate_batch_refuses_an_item_that_is_not_a_pair(item, what):
    engine = _engine()
    before = _memory(engine)
    with pytest.raises(UsageError, match=f"takes a list of \\(prompt_ids, params\\) pairs; item 1 is {what}:"):
        engine.generate_batch([([5, 6], THREE), item])
    assert not engine.requests and not engine.scheduler.has_work() and _memory(engine) == before


def test_fp8_e4m3_without_calibrated_scales_is_refused_before_the_model_is_fused():
    """The refusal comes before fuse_model and the cache pools (sized from the GPU's free memory)."""
    from salactl.errors import ConfigError

    model = micro_model()
    with pytest.raises(ConfigError, match="fp8_e4m3 needs calibrated k/v scales"):
        GPUEngine(model, "cpu", max_running_requests=2, chunk_size=32, kv_tokens=512, kv_cache_dtype="fp8_e4m3")
    assert type(model.model.layers[0].self_attn) is type(micro_model().model.layers[0].self_attn)


def test_an_unseeded_sampled_request_draws_as_seed_0():
    """The GPU engine's default seed is the CPU engine's: 0 (unseeded runs repeat), not another."""
    engine = _engine()

    def draws(**kw):
        params = SamplingParams(max_new_tokens=8, temperature=1.0, ignore_eos=True, **kw)
        return engine.generate([5, 17, 40, 41, 99, 3], params).output_token_ids

    unseeded = draws()
    assert unseeded == draws(seed=0)
    assert unseeded != draws(seed=1)        # this prompt's draws tell the two seeds apart

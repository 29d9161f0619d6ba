"""salactl as a Python library: the package-level API, argument checks that give UsageError /
DeviceError instead of tracebacks or silently wrong runs, and a GPU engine that forgets the
requests it has handed back. CPU only; the GPU engine runs in Triton's interpreter."""

import importlib.util
import os
import subprocess
import sys
import threading

import numpy as np
import pytest
import torch

from conftest import micro_model, run_cli
from salactl.errors import DeviceError, ModelLimitWarning, UsageError
from salactl.runtime.engine import Engine, GenerationResult, PhaseStats
from salactl.runtime.loader import load_model, meta_model, resolve_dtype
from salactl.runtime.sampling import SamplingParams

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"     # before triton is first imported (GPU engine tests)
# GPUEngine's API tests run on the GPU where there is one, else in Triton's interpreter on the CPU
DEV = "cuda" if torch.cuda.is_available() else "cpu"
gpu_engine_api = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="GPUEngine needs triton")

API = ["Engine", "GPUEngine", "GeneratedText", "GenerationResult", "LoadedModel", "SamplingParams",
       "StreamDecoder", "Tokenizer", "find_tokenizer", "load_model", "stop_token_ids"]
GREEDY3 = SamplingParams(max_new_tokens=3, ignore_eos=True)


@pytest.fixture(scope="module")
def engine():
    return Engine(micro_model())


# ---- finding 1: one import path, documented -------------------------------------------------
def test_package_exports_the_api_lazily():
    import salactl

    listed = sorted(n for n in API if n != "GPUEngine" or importlib.util.find_spec("triton"))
    assert salactl.__all__ == listed and set(listed) <= set(dir(salactl))
    from salactl import Engine as E, SamplingParams as S
    assert E is Engine and S is SamplingParams
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        salactl.nope  # noqa: B018
    cold = subprocess.run([sys.executable, "-c", "import salactl, sys; print('torch' in sys.modules)"],
                          capture_output=True, text=True, check=True)
    assert cold.stdout.strip() == "False"          # `import salactl` (and the CLI's start) stays cheap


def test_public_objects_have_docstrings():
    import salactl

    has_triton = importlib.util.find_spec("triton") is not None       # the GPU engine imports it
    objs = [getattr(salactl, n) for n in API if has_triton or n != "GPUEngine"] + [PhaseStats]
    objs += [salactl.Engine.generate, salactl.Engine.stream, salactl.Tokenizer.encode, salactl.Tokenizer.decode]
    if has_triton:
        objs += [salactl.GPUEngine.submit, salactl.GPUEngine.generate, salactl.GPUEngine.result]
    # a dataclass without one gets "Name(field: type, ...)" as its __doc__
    missing = [o.__qualname__ for o in objs if not o.__doc__ or o.__doc__.startswith(o.__name__ + "(")]
    assert not missing
    for word in ("stop/EOS token", '"length"', '"stop"', '"abort"', '"error"', "wall seconds"):
        assert word in GenerationResult.__doc__
    assert "wall seconds" in PhaseStats.__doc__ and "time_ops" in PhaseStats.__doc__


# ---- finding 3: prompt ids are integers ----------------------------------------------------
@pytest.mark.parametrize("prompt, message", [
    ([5, 6.0, 7], "must be integers, got 6.0"), ([5, True], "must be integers, got True"),
    ("hello", "pass token ids \\(Tokenizer.encode"), (torch.tensor([[5, 6]]), "must be 1-D"),
    (torch.tensor([5.0, 6.0]), "must be integers"), (None, "list of token ids, got NoneType")])
def test_prompts_that_are_not_token_ids_are_usage_errors(engine, prompt, message):
    with pytest.raises(UsageError, match=message):
        engine.generate(prompt, GREEDY3)
    with pytest.raises(UsageError, match=message):
        engine.stream(prompt, GREEDY3)


def test_integer_tensors_and_arrays_are_prompts_and_the_result_has_the_ids_that_ran(engine):
    want = engine.generate([5, 6, 7], GREEDY3)
    for prompt in (torch.tensor([5, 6, 7]), np.array([5, 6, 7]), (np.int64(5), 6, 7)):
        got = engine.generate(prompt, GREEDY3)
        assert got.output_token_ids == want.output_token_ids
        assert got.prompt_token_ids == [5, 6, 7] and all(type(t) is int for t in got.prompt_token_ids)
    assert list(engine.stream(torch.tensor([5, 6, 7]), GREEDY3)) == want.output_token_ids


# ---- finding 4: argument types ---------------------------------------------------------------
@pytest.mark.parametrize("kw, message", [
    (dict(temperature="0.7"), "temperature \\(--temperature\\) must be a number, got '0.7'"),
    (dict(temperature=None), "temperature .* must be a number, got None"),
    (dict(top_p="0.9"), "top_p \\(--top-p\\) must be a number"),
    (dict(seed="1"), "seed \\(--seed\\) must be an integer"),
    (dict(seed=1.5), "seed \\(--seed\\) must be an integer, got 1.5"),
    (dict(stop_token_ids=("\n",)), "stop strings are not token ids; pass token ids"),
    (dict(stop_token_ids="\n"), "stop strings are not token ids; pass token ids"),
    (dict(stop_token_ids=[1.5]), "stop_token_ids must hold integer token ids"),
    (dict(ignore_eos="no"), "ignore_eos \\(--ignore-eos\\) must be True or False"),
    (dict(max_new_tokens=-1), "^max_new_tokens \\(--max-new-tokens\\) must be >= 0, got -1$"),
])
def test_sampling_params_check_types(kw, message):
    with pytest.raises(UsageError, match=message):
        SamplingParams(**kw)


def test_stop_token_ids_become_a_tuple_of_ints():
    p = SamplingParams(stop_token_ids=[np.int64(5), 7])
    assert p.stop_token_ids == (5, 7) and all(type(t) is int for t in p.stop_token_ids)
    assert hash(p) == hash(SamplingParams(stop_token_ids=(5, 7)))
    assert SamplingParams(stop_token_ids=5).stop_token_ids == (5,)


def test_params_default_to_greedy_and_must_be_sampling_params(engine):
    assert engine.generate([5, 6, 7]).output_token_ids == \
        engine.generate([5, 6, 7], SamplingParams()).output_token_ids
    with pytest.raises(UsageError, match="params must be a SamplingParams, got dict"):
        engine.generate([5, 6, 7], {"max_new_tokens": 3})


def test_eos_ids_take_an_int(engine):
    free = engine.generate([5, 6, 7], SamplingParams(max_new_tokens=6)).output_token_ids
    stop = free[1]
    res = engine.generate([5, 6, 7], SamplingParams(max_new_tokens=6), eos_ids=stop)
    assert res.output_token_ids == free[:free.index(stop) + 1] and res.finish_reason == "stop"
    with pytest.raises(UsageError, match="eos_ids"):
        engine.generate([5, 6, 7], GREEDY3, eos_ids="\n")


def test_engine_takes_a_loaded_model_and_defaults_to_its_device():
    lm = load_model("sala-nano", "cpu", torch.float32)              # a torch.dtype (finding 5)
    assert lm.model.model.embed_tokens.weight.dtype == torch.float32
    eng = Engine(lm)
    assert eng.model is lm.model and eng.device == torch.device("cpu")
    assert eng.generate([1, 5, 9], GREEDY3).output_token_ids == \
        Engine(lm.model, "cpu").generate([1, 5, 9], GREEDY3).output_token_ids


@pytest.mark.parametrize("device, error, message", [
    ("gpu", UsageError, "device \\(--device\\) 'gpu' is unknown"),
    ("cpu", DeviceError, "device 'cpu' differs from the model's device 'meta'")])
def test_engine_device_must_be_the_models(device, error, message):
    with pytest.raises(error, match=message):
        Engine(meta_model(micro_model().config), device)


def test_engine_refuses_cuda_without_a_gpu():
    if torch.cuda.is_available():
        pytest.skip("a GPU is visible")
    with pytest.raises(DeviceError, match="no CUDA GPU"):
        Engine(micro_model(), "cuda")


# ---- finding 5: messages name the argument and the flag; dtype objects ----------------------
def test_runtime_messages_name_argument_and_flag():
    with pytest.raises(UsageError, match="^chunk_size \\(--chunk-size\\) must be a positive integer, got 0$"):
        Engine(micro_model(), chunk_size=0)
    with pytest.raises(UsageError, match="^dtype \\(--dtype\\) torch.int8 is unknown; valid: auto, bf16"):
        resolve_dtype(torch.int8, torch.device("cpu"))
    assert resolve_dtype(torch.bfloat16, torch.device("cpu")) is torch.bfloat16


# ---- finding 11: RunRequest -------------------------------------------------------------------
@pytest.mark.parametrize("kw", [{}, {"prompt": "hi", "prompt_ids": [1, 2]}])
def test_run_request_needs_exactly_one_prompt(kw):
    from salactl.run_job import RunRequest, execute

    assert RunRequest(prompt="hi").prompt_ids is None
    with pytest.raises(UsageError, match="exactly one of prompt \\(--prompt\\) and prompt_ids"):
        execute(RunRequest(**kw))


# ---- the bench driver forgets finished requests ----------------------------------------------
def test_serial_driver_keeps_nothing_after_a_request(engine):
    from salactl.bench.targets.engine_driver import EngineDriver, SerialStepper

    stepper = SerialStepper(engine)
    driver = EngineDriver(stepper, 1)
    try:
        assert len(list(driver.submit([5, 6, 7], GREEDY3, threading.Event()))) == 3
    finally:
        driver.close()
    assert not stepper.done


# ---- findings 3, 6, 7 on the GPU engine (Triton interpreter) ---------------------------------
def _gpu(model=None, **kw):
    from salactl.runtime.gpu.engine import GPUEngine

    return GPUEngine((model or micro_model()).to(DEV), DEV, max_running_requests=2, chunk_size=32, kv_tokens=256,
                     **kw)


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="needs triton")
def test_gpu_engine_refuses_a_cpu_device_outside_the_interpreter(monkeypatch):
    import salactl.runtime.gpu.engine  # noqa: F401  triton reads TRITON_INTERPRET when first imported

    from salactl.runtime.gpu.engine import GPUEngine

    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(DeviceError, match="GPUEngine needs a CUDA device, got 'cpu'"):
        GPUEngine(micro_model(), "cpu")


@gpu_engine_api
def test_gpu_engine_checks_prompts_and_forgets_what_it_handed_back():
    gpu = _gpu()
    for bad, message in (([5, 6.5], "must be integers"), ("hi", "pass token ids")):
        with pytest.raises(UsageError, match=message):
            gpu.submit(bad, GREEDY3)
    want = Engine(micro_model()).generate([5, 6, 7], GREEDY3).output_token_ids     # unfused reference
    res = gpu.generate(torch.tensor([5, 6, 7]), GREEDY3)
    assert res.output_token_ids == want and res.prompt_token_ids == [5, 6, 7]
    assert [r.output_token_ids for r in gpu.generate_batch([([5, 6, 7], GREEDY3)] * 2)] == [want, want]
    assert not gpu.requests                              # generate / generate_batch took their results
    rid = gpu.submit([5, 6, 7], SamplingParams(max_new_tokens=50, ignore_eos=True))
    next(iter(gpu.events()))                             # a caller who stops reading ...
    gpu.abort(rid)                                       # ... aborts, then takes the partial result
    assert gpu.result(rid).finish_reason == "abort" and not gpu.requests and not gpu.scheduler.has_work()
    with pytest.raises(UsageError, match="request 0 is unknown"):
        gpu.result(0)


def _nan_on_token_99():
    """A micro model whose logits turn NaN once token 99 is fed (an Inf embedding row)."""
    model = micro_model()
    with torch.no_grad():
        model.model.embed_tokens.weight[99] = float("inf")
    return model


@gpu_engine_api
def test_gpu_engine_forgets_a_request_whose_generation_failed():
    from salactl.errors import NumericsError

    gpu = _gpu(_nan_on_token_99())
    with pytest.raises(NumericsError):
        gpu.generate([5, 99, 6], GREEDY3)
    assert not gpu.requests and not gpu.scheduler.has_work()


def _idle(gpu) -> bool:
    """No request left behind: none kept, no scheduler work, every slot and page free."""
    sched = gpu.scheduler
    return (not gpu.requests and not sched.has_work() and sched.slots.free == sched.slots.total
            and sched.pages.free == sched.pages.total)


@gpu_engine_api
def test_gpu_engine_takes_engines_calls_for_one_request():
    """A user moving to the GPU swaps the class and keeps generate/stream/kv_cache_dtype: the same
    greedy tokens as Engine, interleaved streams each get their own, early close releases."""
    gpu = _gpu()
    params = SamplingParams(max_new_tokens=4, ignore_eos=True)
    reference = Engine(micro_model())                    # GPUEngine fused its own model in place
    want = {p: reference.generate(p, params).output_token_ids for p in ((5, 6, 7), (9, 8))}
    for p, toks in want.items():
        assert gpu.generate(list(p), params).output_token_ids == toks
    a, b = gpu.stream([5, 6, 7], params), gpu.stream([9, 8], params)
    got = {(5, 6, 7): [], (9, 8): []}
    for _ in range(4):                                   # read in turn: both run in the same steps
        got[(5, 6, 7)].append(next(a))
        got[(9, 8)].append(next(b))
    assert got == want and list(a) == list(b) == [] and _idle(gpu)
    early = gpu.stream([5, 6, 7], SamplingParams(max_new_tokens=50, ignore_eos=True))
    assert next(early) == want[(5, 6, 7)][0]
    early.close()
    assert _idle(gpu)
    gpu.stream([5, 6, 7], params)                        # never read, collected at once
    assert _idle(gpu)
    with pytest.raises(UsageError, match="pass token ids"):
        gpu.stream("hi", params)                         # at the call, not at the first next()
    assert _idle(gpu)


@gpu_engine_api
def test_gpu_engine_fuses_the_callers_model_in_place_as_documented():
    """No second copy of the weights: the model passed in becomes the fused one, and the class
    docstring says so (a reference for comparisons must be built separately)."""
    from salactl.runtime.gpu.fast_model import FusedSalaForCausalLM

    model = micro_model()
    gpu = _gpu(model)
    assert gpu.model is model and type(model) is FusedSalaForCausalLM
    assert "fuses `model` in place" in " ".join(type(gpu).__doc__.split())


@gpu_engine_api
def test_no_sampled_token_has_no_ttft_but_a_prefill_time():
    model = micro_model()
    gpu = _gpu(model)                                    # may move the model: Engine follows its device
    for engine in (Engine(model), gpu):
        res = engine.generate([5, 6, 7], SamplingParams(max_new_tokens=0))
        assert res.output_token_ids == [] and res.ttft_s is None and res.prefill.seconds > 0
        one = engine.generate([5, 6, 7], SamplingParams(max_new_tokens=1, ignore_eos=True))
        assert one.ttft_s == one.prefill.seconds > 0


@gpu_engine_api
def test_non_finite_logits_fail_only_their_own_stream():
    """Interleaved streams in one step: the request whose logits are NaN raises NumericsError; the
    other still yields the reference tokens (a step-wide failure: the interrupt test below)."""
    from salactl.errors import NumericsError

    gpu = _gpu(_nan_on_token_99())
    good, bad = gpu.stream([5, 6, 7], GREEDY3), gpu.stream([5, 99, 6], GREEDY3)
    assert list(good) == Engine(micro_model()).generate([5, 6, 7], GREEDY3).output_token_ids
    with pytest.raises(NumericsError):
        next(bad)
    assert _idle(gpu)


@gpu_engine_api
def test_gpu_engine_refuses_an_unknown_kv_cache_dtype():
    with pytest.raises(UsageError, match="kv_cache_dtype \\(--kv-cache-dtype\\) 'int3' is unknown"):
        _gpu(kv_cache_dtype="int3")


def test_readme_python_examples_run_as_written(tmp_path, capsys):
    """Every ```python block of README.md's "Python API" section runs, in a fresh interpreter (the
    quantize one with fewer windows), and the greedy example prints what the section says it equals:
    `salactl run --json`'s first tokens and finish reason for the example's own prompt and length."""
    import ast
    import json
    import re
    from pathlib import Path

    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    section = readme.split("## Python API", 1)[1].split("\n## ", 1)[0]
    claim = "greedy output equals `salactl run --json`'s for the same prompt and settings"
    assert claim in " ".join(section.split())
    blocks = [b.split("```", 1)[0] for b in section.split("```python\n")[1:]]
    assert len(blocks) == 2, "the section's examples changed: update this test"
    blocks[1] = blocks[1].replace("nsamples=8, seqlen=512", "nsamples=2, seqlen=64")
    runs = [subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True,
                           timeout=600) for code in blocks]
    for i, p in enumerate(runs):
        assert p.returncode == 0, (i, p.stderr[-2000:])
    assert (tmp_path / "nano-w4" / "config.json").exists()
    (prompt,) = re.findall(r'ids = tok\.encode\(("(?:[^"\\]|\\.)*")\)', blocks[0])
    (greedy,) = re.findall(r"engine\.generate\(ids, SamplingParams\(max_new_tokens=(\d+)\), eos_ids=eos\)",
                           blocks[0])
    assert 'print(res.output_token_ids[:6], res.finish_reason, f"TTFT' in blocks[0]
    code, out, err = run_cli(["run", "--prompt", ast.literal_eval(prompt), "--max-new-tokens", greedy, "--json"],
                             capsys)
    assert code == 0, err
    ran = json.loads(out)
    first = runs[0].stdout.splitlines()[0]
    assert first.startswith(f"{ran['output_token_ids'][:6]} {ran['finish_reason']} TTFT "), (first, ran)


@gpu_engine_api
def test_an_interrupted_step_fails_other_streams_with_an_error_not_the_interrupt(monkeypatch):
    """Ctrl-C in one stream's step reaches that caller; a stream whose request ran in the same
    step raises a RuntimeError saying so when read, not a second KeyboardInterrupt."""
    import salactl.runtime.gpu.engine as gpu_engine

    gpu = _gpu()
    first, second = gpu.stream([5, 6, 7], GREEDY3), gpu.stream([9, 8], GREEDY3)

    def interrupted(logits):
        raise KeyboardInterrupt

    monkeypatch.setattr(gpu_engine, "greedy", interrupted)
    with pytest.raises(KeyboardInterrupt):
        next(first)
    with pytest.raises(RuntimeError, match="interrupted \\(KeyboardInterrupt\\)"):
        next(second)
    assert _idle(gpu)


@gpu_engine_api
def test_gpu_streams_survive_a_caller_taking_results_from_events():
    """A caller reading events() may take result() of every request it sees, those behind a
    stream() included; the stream still ends cleanly, and abort() of a taken request is a
    UsageError, not a KeyError."""
    gpu = _gpu()
    stream = gpu.stream([5, 6, 7], GREEDY3)
    seen = {rid for rid, _, _ in gpu.events()}
    for rid in seen:
        gpu.result(rid)
    assert list(stream) == Engine(micro_model()).generate([5, 6, 7], GREEDY3).output_token_ids
    assert _idle(gpu)
    with pytest.raises(UsageError, match="request 0 is unknown"):
        gpu.abort(0)


@gpu_engine_api
def test_events_yield_the_tokens_another_callers_steps_made_once_each_in_time_order():
    """A submit()ted request advances in the steps of another caller's generate(); events() read
    afterwards still yields every one of its tokens, in the order they were sampled, and a second
    events() yields none of them again."""
    gpu = _gpu()
    long = SamplingParams(max_new_tokens=6, ignore_eos=True)
    rid = gpu.submit([9, 8, 7], long)
    assert gpu.generate([5, 6, 7], GREEDY3).output_token_ids == Engine(micro_model()).generate(
        [5, 6, 7], GREEDY3).output_token_ids
    made_meanwhile = len(gpu.requests[rid].output)
    assert 0 < made_meanwhile < 6                     # part of it ran in generate()'s steps
    events = list(gpu.events())
    assert list(gpu.events()) == []
    res = gpu.result(rid)
    assert [(r, t) for r, t, _ in events] == [(rid, t) for t in res.output_token_ids]
    assert res.output_token_ids == Engine(micro_model()).generate([9, 8, 7], long).output_token_ids
    assert all(a[2] <= b[2] for a, b in zip(events, events[1:]))
    assert _idle(gpu)


@gpu_engine_api
def test_gpu_generate_reports_prefill_progress_as_engine_does():
    prompt = list(range(3, 80))                       # 77 tokens: chunks of 32
    calls = {"gpu": [], "ref": []}
    model = micro_model()
    _gpu(model).generate(prompt, GREEDY3, prefill_progress=lambda d, t: calls["gpu"].append((d, t)))
    Engine(model, chunk_size=32).generate(prompt, GREEDY3,
                                                 prefill_progress=lambda d, t: calls["ref"].append((d, t)))
    assert calls["gpu"] == calls["ref"] == [(32, 77), (64, 77), (77, 77)]


def test_quantizing_a_loaded_model_refuses_load_arguments(tmp_path):
    from salactl.quant.api import quantize_checkpoint

    lm = load_model("sala-nano", "cpu", torch.float32)
    with pytest.raises(UsageError, match="dtype 'bf16' \\(the model is float32\\) apply only when"):
        quantize_checkpoint(lm, tmp_path / "q", dtype="bf16")
    assert not (tmp_path / "q").exists()


def test_gpu_engine_without_triton_says_what_to_install(monkeypatch):
    import salactl

    monkeypatch.delitem(vars(salactl), "GPUEngine", raising=False)      # not yet imported, as without triton
    monkeypatch.setattr(salactl, "_has_triton", lambda: False)
    with pytest.raises(ModuleNotFoundError, match="GPUEngine needs triton \\(pip install 'salactl\\[gpu\\]'"):
        salactl.GPUEngine  # noqa: B018


def _long_request_warnings(run) -> list[str]:
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run()
    assert all(w.filename == __file__ for w in caught), [w.filename for w in caught]
    return [str(w.message) for w in caught if issubclass(w.category, ModelLimitWarning)]


def test_engines_warn_past_the_trained_length_and_about_forced_blocks(engine):
    """What `salactl run` warns about reaches Python callers as a ModelLimitWarning naming their
    own line; short requests stay silent, and the CLI still says it once, in its own words."""
    config = engine.config
    assert config.sparse_config.forced_blocks_note             # the micro model's topk 1 = init blocks
    long = SamplingParams(max_new_tokens=config.max_position_embeddings, ignore_eos=True)
    with pytest.raises(UsageError):                           # checked before it warns: nothing ran
        _long_request_warnings(lambda: engine.generate("text", long))
    assert _long_request_warnings(lambda: engine.generate([5, 6, 7], GREEDY3)) == []
    msgs = _long_request_warnings(lambda: engine.stream([5, 6, 7], long))   # warns at the call
    assert len(msgs) == 2 and "past the model's max_position_embeddings" in msgs[0]
    assert msgs[1] == config.sparse_config.forced_blocks_note


@gpu_engine_api
def test_gpu_engine_warns_as_engine_does():
    gpu = _gpu()
    msgs = _long_request_warnings(lambda: gpu.abort(gpu.submit([5, 6, 7], SamplingParams(max_new_tokens=40))))
    assert msgs == [gpu.config.sparse_config.forced_blocks_note]


def test_the_cli_says_it_once_in_its_own_words(tmp_path, capsys):
    import warnings

    from conftest import run_cli
    from salactl.runtime.checkpoint import random_state_dict
    from salactl.runtime.checkpoint_write import save_checkpoint

    model = micro_model()
    ckpt = save_checkpoint(random_state_dict(model.config, "cpu", torch.float32, 0), model.config.to_hf_dict(),
                           tmp_path / "ckpt")
    ids = ",".join(str(3 + i % 100) for i in range(model.config.sparse_config.dense_len + 5))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        code, _, err = run_cli(["run", "--model", ckpt, "--prompt-ids", ids, "--max-new-tokens", "1", "--json"],
                               capsys)
    assert code == 0, err
    assert err.count(model.config.sparse_config.forced_blocks_note) == 1
    assert not [w for w in caught if issubclass(w.category, ModelLimitWarning)]

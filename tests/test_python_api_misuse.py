"""The Python API refuses misused arguments with a one-line UsageError when it is called, not
with a raw traceback later (or never): what Engine takes as its model and backend, callbacks,
stop/EOS ids that could never match, and GeneratedText's stop_ids."""

import pytest

from conftest import micro_model
from salactl.errors import UsageError
from salactl.runtime.backend_reference import ReferenceBackend
from salactl.runtime.engine import Engine
from salactl.runtime.loader import EMBEDDED_DIR
from salactl.runtime.sampling import SamplingParams
from salactl.runtime.stream_decoder import GeneratedText
from salactl.runtime.tokenizer import Tokenizer

GREEDY2 = SamplingParams(max_new_tokens=2, ignore_eos=True)


@pytest.fixture(scope="module")
def model():
    return micro_model()


@pytest.fixture(scope="module")
def engine(model):
    return Engine(model)


@pytest.mark.parametrize("arg, message", [
    ("sala-nano", "^model must be the LoadedModel from load_model\\(\\.\\.\\.\\) or a SalaForCausalLM, got "
                  "str; for a preset or checkpoint pass load_model\\('sala-nano'\\)$"),
    (None, "model must be the LoadedModel .* got NoneType$"),
])
def test_engine_takes_a_loaded_model_or_module(arg, message):
    with pytest.raises(UsageError, match=message):
        Engine(arg)


def test_engine_refuses_a_models_config(model):
    with pytest.raises(UsageError, match="got SalaConfig$"):
        Engine(model.config)


def test_engine_backend_by_name_or_object(model):
    with pytest.raises(UsageError, match="^backend 'triton' is unknown; valid: reference, or an attention "
                                         "backend object such as ReferenceBackend \\(the Triton kernels run in GPUEngine\\)$"):
        Engine(model, backend="triton")
    with pytest.raises(UsageError, match="backend must be a name .* got int"):
        Engine(model, backend=5)
    want = Engine(model).generate([5, 6, 7], GREEDY2).output_token_ids
    assert isinstance(Engine(model, backend="reference").backend, ReferenceBackend)
    assert Engine(model, backend="reference").generate([5, 6, 7], GREEDY2).output_token_ids == want
    assert Engine(model, backend=ReferenceBackend(model.config)).generate([5, 6, 7], GREEDY2).output_token_ids == want


def test_on_token_must_be_callable_before_the_prefill_runs(engine):
    done = []
    with pytest.raises(UsageError, match="^on_token must be a function or None, got 5$"):
        engine.generate([5, 6, 7], GREEDY2, on_token=5, prefill_progress=lambda n, total: done.append(n))
    assert done == []


def test_prefill_progress_must_be_callable(engine):
    with pytest.raises(UsageError, match="^prefill_progress must be a function or None, got 'yes'$"):
        engine.generate([5, 6, 7], GREEDY2, prefill_progress="yes")


@pytest.mark.parametrize("kw, message", [
    (dict(stop_token_ids=[-1]), "^stop_token_ids must hold token ids >= 0, got -1$"),
    (dict(stop_token_ids=-3), "^stop_token_ids must hold token ids >= 0, got -3$"),
])
def test_negative_stop_ids_are_refused(kw, message):
    with pytest.raises(UsageError, match=message):
        SamplingParams(**kw)


@pytest.mark.parametrize("kw, bad", [
    (dict(params=SamplingParams(max_new_tokens=2, stop_token_ids=[5, 2**70])), 2**70),
    (dict(params=SamplingParams(max_new_tokens=2, stop_token_ids=128)), 128),
    (dict(params=SamplingParams(max_new_tokens=2), eos_ids=[1000]), 1000),
])
def test_stop_and_eos_ids_must_be_in_the_models_vocabulary(engine, kw, bad):
    with pytest.raises(UsageError, match=f"^stop token id {bad} is outside the model's vocabulary \\(0\\.\\.127\\)$"):
        engine.generate([5, 6, 7], **kw)
    with pytest.raises(UsageError, match="outside the model's vocabulary"):
        engine.stream([5, 6, 7], **kw)


def test_eos_ids_must_not_be_negative(engine):
    with pytest.raises(UsageError, match="^eos_ids must hold token ids >= 0, got -1$"):
        engine.generate([5, 6, 7], GREEDY2, eos_ids=[-1])


def test_the_last_vocabulary_id_is_a_stop_id(engine):
    res = engine.generate([5, 6, 7], SamplingParams(max_new_tokens=2, stop_token_ids=[127]))
    assert len(res.output_token_ids) >= 1


@pytest.fixture(scope="module")
def tok():
    return Tokenizer(EMBEDDED_DIR)


def test_generated_text_stop_ids_take_an_int_or_none(tok):
    assert GeneratedText(tok, stop_ids=2).stop_ids == {2}
    assert GeneratedText(tok, stop_ids=None).stop_ids == frozenset()
    text = GeneratedText(tok, stop_ids=tok.encode("a", add_special_tokens=False)[0])
    assert text.push(tok.encode("a", add_special_tokens=False)[0]) == "" and text.flush() == ""


@pytest.mark.parametrize("stop_ids, message", [
    ("</s>", "^stop_ids got text '</s>': stop strings are not token ids; pass token ids \\(Tokenizer.encode "
             "gives them\\), or the text as GeneratedText\\(stop=\\.\\.\\.\\) \\(`run --stop`\\)$"),
    (["</s>"], "^stop_ids must hold integer token ids, got '</s>'; stop strings are not token ids"),
    ([-2], "^stop_ids must hold token ids >= 0, got -2$"),
    (2.0, "^stop_ids must be a token id or an iterable of token ids, got 2.0$"),
])
def test_generated_text_refuses_bad_stop_ids(tok, stop_ids, message):
    with pytest.raises(UsageError, match=message):
        GeneratedText(tok, stop_ids=stop_ids)

"""Engine.stream checks the prompt when it is called, as generate does, not at the first next()."""

import pytest

from conftest import micro_model
from salactl.errors import UsageError
from salactl.runtime.engine import Engine
from salactl.runtime.sampling import SamplingParams


@pytest.fixture(scope="module")
def engine():
    return Engine(micro_model(), "cpu")


@pytest.mark.parametrize("prompt, message", [([], "the prompt is empty"),
                                             ([1, 128], "token id 128 is outside the vocabulary")])
def test_stream_rejects_a_bad_prompt_before_iteration(engine, prompt, message):
    params = SamplingParams(max_new_tokens=2)
    with pytest.raises(UsageError, match=message):
        engine.stream(prompt, params)
    with pytest.raises(UsageError, match=message):
        engine.generate(prompt, params)


def test_stream_yields_what_generate_returns(engine):
    params = SamplingParams(max_new_tokens=3, ignore_eos=True)
    tokens = engine.stream([5, 6, 7], params)
    assert list(tokens) == engine.generate([5, 6, 7], params).output_token_ids

"""stop_token_ids / eos_ids / stop_ids take a 1-D (or 0-D) integer tensor or array, as the prompt
does; float, bool and multi-dimensional ones are a one-line UsageError naming the argument."""

import numpy as np
import pytest
import torch

from conftest import micro_model
from salactl.errors import UsageError
from salactl.runtime.engine import Engine
from salactl.runtime.sampling import SamplingParams, as_token_ids


@pytest.mark.parametrize("value,want", [(torch.tensor([2, 7]), (2, 7)), (torch.tensor(2), (2,)),
                                        (np.array([3, 4], dtype=np.int32), (3, 4)), (np.array(5), (5,)),
                                        (torch.tensor([], dtype=torch.long), ())])
def test_integer_tensors_are_token_ids(value, want):
    got = as_token_ids(value, "eos_ids")
    assert got == want and all(type(t) is int for t in got)


@pytest.mark.parametrize("value,match", [
    (torch.tensor([[2, 3]]), r"eos_ids as a tensor must be 1-D \(or 0-D\), got shape \(1, 2\)"),
    (torch.tensor([2.0]), "eos_ids must hold integer token ids, got 2.0"),
    (np.array([1.5]), "eos_ids must hold integer token ids, got 1.5"),
    (torch.tensor([True]), "eos_ids must hold integer token ids, got True"),
    (torch.tensor([-1]), "eos_ids must hold token ids >= 0, got -1")])
def test_other_tensors_are_refused_naming_the_argument(value, match):
    with pytest.raises(UsageError, match=match) as err:
        as_token_ids(value, "eos_ids")
    assert "\n" not in str(err.value)


def test_the_engine_stops_at_ids_given_as_tensors():
    engine, prompt = Engine(micro_model(), "cpu"), [5, 6, 7]
    free = engine.generate(prompt, SamplingParams(max_new_tokens=6, ignore_eos=True)).output_token_ids
    stop = free[2]
    at = free.index(stop)
    by_params = engine.generate(torch.tensor(prompt),
                                SamplingParams(max_new_tokens=6, stop_token_ids=torch.tensor([stop])))
    by_eos = engine.generate(prompt, SamplingParams(max_new_tokens=6), eos_ids=torch.tensor([stop]))
    for res in (by_params, by_eos):
        assert (res.output_token_ids, res.finish_reason) == (free[:at + 1], "stop")
    with pytest.raises(UsageError, match="stop_token_ids as a tensor must be 1-D"):
        SamplingParams(stop_token_ids=torch.tensor([[stop]]))

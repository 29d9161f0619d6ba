"""A repetition penalty so near 0 that a penalised logit overflows to +inf is the request's settings'
fault, not the model's: a one-line UsageError naming --repetition-penalty (exit 2), not the NaN/Inf
NumericsError (exit 15) that blames the checkpoint."""

import pytest
import torch

from conftest import run_cli
from salactl.errors import NumericsError, UsageError
from salactl.runtime.sampling import PenaltyOverflowError, SamplingParams, logits_processors, sample

TINY = 1e-38                      # 10 / 1e-38 = 1e39 > float32's max (3.4e38)


@pytest.mark.parametrize("temperature", [0.0, 0.7])
def test_sample_blames_the_penalty_for_the_inf_it_makes(temperature):
    params = SamplingParams(repetition_penalty=TINY, temperature=temperature)
    processors = logits_processors(params, [0], set(), 3, torch.device("cpu"))
    with pytest.raises(PenaltyOverflowError) as err:
        sample(torch.tensor([10.0, -1.0, 0.5]), params, torch.Generator().manual_seed(0), processors)
    msg = str(err.value)
    assert "repetition_penalty (--repetition-penalty) 1e-38" in msg and "output token 1" in msg
    assert "float32" in msg and "NaN" not in msg and "checkpoint" not in msg and "\n" not in msg
    assert isinstance(err.value, UsageError) and not isinstance(err.value, NumericsError)


def test_a_penalised_logit_that_stays_finite_is_sampled():
    """0.5 / 1e-38 = 5e37 fits float32: the penalised token is drawn, nothing raised."""
    params = SamplingParams(repetition_penalty=TINY)
    processors = logits_processors(params, [2], set(), 3, torch.device("cpu"))
    assert sample(torch.tensor([3.0, -1.0, 0.5]), params, None, processors) == 2


def test_model_nan_logits_stay_a_numerics_error_with_the_penalty_on():
    params = SamplingParams(repetition_penalty=TINY)
    processors = logits_processors(params, [0], set(), 3, torch.device("cpu"))
    with pytest.raises(NumericsError):
        sample(torch.tensor([1.0, float("nan"), 0.0]), params, None, processors)


def test_run_cli_exits_2_with_one_line_naming_the_penalty(capsys):
    code, out, err = run_cli(["run", "-p", "Hi", "-n", "3", "--repetition-penalty", "1e-38", "--json",
                              "--device", "cpu"], capsys)
    assert code == 2, err
    assert err.strip().count("\n") == 0 and "--repetition-penalty" in err and "1e-38" in err, err
    assert "NaN" not in err and out == ""


def test_the_message_names_the_dtype_the_logits_overflowed():
    """bf16 logits (a bf16 model on the GPU engine) overflow at bf16's range, not float32's."""
    params = SamplingParams(repetition_penalty=TINY)
    processors = logits_processors(params, [0], set(), 3, torch.device("cpu"))
    err = processors.settings_error(torch.tensor([float("inf"), 1.0, 0.0], dtype=torch.bfloat16))
    assert "past bfloat16's range" in str(err) and isinstance(err, PenaltyOverflowError)

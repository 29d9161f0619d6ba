"""SamplingParams takes any real number for temperature and top_p (a Fraction, a numpy float, an
int) and stores the float the sampler computes with: a Fraction or a huge int would otherwise pass
the checks and fail mid-generation with a raw TypeError or OverflowError."""

from fractions import Fraction

import numpy as np
import pytest

from conftest import micro_model
from salactl.errors import UsageError
from salactl.runtime.engine import Engine
from salactl.runtime.sampling import SamplingParams


@pytest.mark.parametrize("value, want", [(Fraction(1, 2), 0.5), (np.float32(0.25), 0.25), (1, 1.0),
                                         (np.int64(1), 1.0), (0.75, 0.75)])
def test_temperature_and_top_p_are_stored_as_floats(value, want):
    params = SamplingParams(temperature=value, top_p=value)
    assert type(params.temperature) is type(params.top_p) is float
    assert params.temperature == params.top_p == want


def test_a_fraction_samples_as_its_float_does():
    engine = Engine(micro_model())
    ids = [5, 6, 7]

    def run(t, p):
        params = SamplingParams(max_new_tokens=6, temperature=t, top_p=p, top_k=0, seed=3, ignore_eos=True)
        return engine.generate(ids, params).output_token_ids

    assert run(Fraction(7, 10), Fraction(9, 10)) == run(0.7, 0.9)


@pytest.mark.parametrize("name, value", [("temperature", 10 ** 400), ("top_p", -10 ** 400),
                                         ("temperature", Fraction(10 ** 400, 3)), ("temperature", 10 ** 5000)],
                         ids=["1e400", "-1e400", "fraction", "5000-digits"])  # repr(10**5000) itself fails
def test_a_number_past_a_float_is_a_one_line_usage_error(name, value):
    flag = "--" + name.replace("_", "-")
    with pytest.raises(UsageError, match=rf"^{name} \({flag}\) must be a number a float can hold \(within "
                                         r"±1\.8e308\), got one past it$"):
        SamplingParams(**{name: value})


@pytest.mark.parametrize("kw, match", [(dict(temperature=Fraction(-1, 2)), r"temperature .* >= 0 .*got -0\.5$"),
                                       (dict(top_p=Fraction(3, 2)), r"top_p .* in \(0, 1\], got 1\.5$"),
                                       (dict(top_p=Fraction(0)), r"top_p .* in \(0, 1\], got 0\.0$")])
def test_the_range_checks_see_the_float(kw, match):
    with pytest.raises(UsageError, match=match):
        SamplingParams(**kw)

"""Requests past the trained length, each of another length, from one line of the caller's code:
under Python's default filters the ModelLimitWarning shows once and the caller's warnings
registry stays small (it held one entry per distinct length)."""

import warnings

from salactl import Engine, SamplingParams
from salactl.errors import ModelLimitWarning
from conftest import micro_model

CALLER = """
for extra in range(200):      # stream() checks (and warns) at the call; nothing is generated
    engine.stream([5, 6, 7], SamplingParams(max_new_tokens=limit + extra, ignore_eos=True))
"""


def test_past_the_trained_length_warns_once_per_line_with_the_models_limit():
    engine = Engine(micro_model())
    limit = engine.config.max_position_embeddings
    caller = {"__name__": "a_caller", "engine": engine, "SamplingParams": SamplingParams, "limit": limit}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("default")
        exec(CALLER, caller)
    past = [str(w.message) for w in caught
            if issubclass(w.category, ModelLimitWarning) and "max_position_embeddings" in str(w.message)]
    assert len(past) == 1 and f"max_position_embeddings ({limit:,} tokens)" in past[0]
    assert len(caller["__warningregistry__"]) <= 3      # 'version', this warning, the forced-blocks note

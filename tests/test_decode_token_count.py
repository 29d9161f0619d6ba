"""The decode phase counts the tokens fed back, output length - 1 (the first token comes from
prefill), in the Engine's PhaseStats and in `run`'s record (decode_tok_s over the decode seconds)."""

import pytest

from conftest import micro_model
from salactl.run_job import RunRequest, execute
from salactl.runtime.engine import Engine
from salactl.runtime.sampling import SamplingParams

PROMPT = [1, 5, 9, 13, 17]


@pytest.mark.parametrize("n", [1, 2, 3, 5])
def test_engine_decode_tokens_are_output_minus_one(n):
    res = Engine(micro_model()).generate(PROMPT, SamplingParams(max_new_tokens=n, ignore_eos=True))
    assert len(res.output_token_ids) == n
    assert res.decode.tokens == res.decode.forward_calls == n - 1
    assert res.prefill.tokens == len(PROMPT)
    if n == 1:
        assert res.decode.seconds == 0.0


def test_run_record_decode_rate_counts_fed_back_tokens():
    rec = execute(RunRequest(prompt_ids=PROMPT, max_new_tokens=3, ignore_eos=True))
    assert len(rec["output_token_ids"]) == 3
    total = rec["roofline"]["decode"][-1]
    assert total["op"] == "total" and total["steps"] == 2
    assert rec["decode_tok_s"] * total["time_s"] == pytest.approx(2)         # 3 outputs, 2 decode steps

    one = execute(RunRequest(prompt_ids=PROMPT, max_new_tokens=1, ignore_eos=True))
    assert len(one["output_token_ids"]) == 1
    assert one["decode_tok_s"] is None and one["roofline"]["decode"] == []    # no decode step ran

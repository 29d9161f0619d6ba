"""The default seed (None samples as seed 0: unseeded requests are reproducible) and min_p at its
edges, against HF's MinPLogitsWarper: probs = softmax(logits); drop probs < min_p * probs.max()
(strictly below: a token exactly at the threshold stays); the top token always stays."""

import math

import pytest
import torch

from conftest import micro_model
from salactl.runtime.engine import Engine
from salactl.runtime.sampling import SamplingParams, sample

LN2 = math.log(2.0)


def test_an_unseeded_request_samples_as_seed_0_not_seed_1():
    eng = Engine(micro_model(), "cpu")
    prompt = [5, 17, 40, 41, 99, 3]

    def gen(**kw):
        return eng.generate(prompt, SamplingParams(max_new_tokens=8, temperature=1.0, ignore_eos=True,
                                                   **kw)).output_token_ids

    assert SamplingParams().seed is None
    unseeded = gen()
    assert len(unseeded) == 8
    assert unseeded == gen(seed=0)
    assert unseeded != gen(seed=1)          # this prompt's draws tell the two seeds apart
    assert list(eng.stream(prompt, SamplingParams(max_new_tokens=8, temperature=1.0, ignore_eos=True))) == unseeded


def _seen(logits, n=300, **kw):
    g = torch.Generator().manual_seed(0)
    return {sample(torch.tensor(logits), SamplingParams(temperature=1.0, **kw), g) for _ in range(n)}


# the top token in the middle (index 2), so nothing can stand in for probs.max() by position;
# exp(-ln 2) is exactly 0.5 in fp32, so token 1's probability is exactly half the top one's
EDGE = [-LN2 + 1e-3, -LN2, 0.0, -LN2 - 1e-3, -2.0]


def test_min_p_keeps_a_token_exactly_at_the_threshold_and_drops_one_just_below():
    probs = torch.softmax(torch.tensor(EDGE), dim=-1)
    assert probs[1] == 0.5 * probs.max(), "precondition: fp32 exp(-ln 2) is not exactly 0.5 here"
    # ratios to the top: 0.5005, 0.5 (= min_p: stays), 1, 0.4995 (< min_p: dropped), 0.135
    assert _seen(EDGE, min_p=0.5) == {0, 1, 2}
    assert _seen(EDGE, min_p=0.4) == {0, 1, 2, 3}
    assert _seen(EDGE, min_p=0.501) == {2}      # 0.5005 < 0.501: only the top is left
    assert _seen(EDGE) == {0, 1, 2, 3, 4}


def test_min_p_one_keeps_only_the_top_tokens_ties_included():
    logits = [1.0, 3.0, 2.9, 3.0, -2.0, 3.0]
    # the three tied at 3.0 are each exactly min_p (1.0) times the top probability: all stay
    assert _seen(logits, min_p=1.0) == {1, 3, 5}
    g = torch.Generator().manual_seed(0)
    lone = torch.tensor([0.5, 2.0, 1.9, -1.0])
    assert {sample(lone, SamplingParams(temperature=1.0, min_p=1.0), g) for _ in range(50)} == {1}


def test_min_p_zero_or_below_every_ratio_changes_no_draw():
    logits = torch.tensor([0.3, -8.0, 1.2, 0.0, -20.0, 1.1])
    for min_p in (0.0, 1e-12):      # the least ratio is exp(-21.2) ~ 6e-10: nothing is dropped
        a, b = torch.Generator().manual_seed(3), torch.Generator().manual_seed(3)
        plain = [sample(logits, SamplingParams(temperature=1.0), a) for _ in range(200)]
        assert [sample(logits, SamplingParams(temperature=1.0, min_p=min_p), b) for _ in range(200)] == plain
    assert SamplingParams().min_p == 0.0


@pytest.mark.parametrize("temperature", [0.5, 2.0])
def test_min_p_reads_the_probabilities_after_temperature(temperature):
    # at temperature t a logit x below the top has ratio exp(x / t), 0.5 at x = -t ln 2: token 1 just
    # below it is dropped, token 2 just above stays (on the untempered logits both would stay at t = 0.5
    # and both go at t = 2)
    logits = [0.0, -temperature * LN2 - 1e-3, -temperature * LN2 + 1e-3, 0.0]
    g = torch.Generator().manual_seed(0)
    seen = {sample(torch.tensor(logits), SamplingParams(temperature=temperature, min_p=0.5), g)
            for _ in range(300)}
    assert seen == {0, 2, 3}

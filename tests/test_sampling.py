import json

import pytest
import torch

from salactl.errors import UsageError
from salactl.runtime.sampling import SamplingParams, sample


def test_top_k_one_is_greedy():
    logits = torch.randn(100, generator=torch.Generator().manual_seed(0))
    g = torch.Generator().manual_seed(0)
    for _ in range(5):
        assert sample(logits, SamplingParams(temperature=2.0, top_k=1), g) == int(logits.argmax())


def test_top_k_past_the_vocabulary_keeps_every_token():
    logits = [0.0, 0.1, 0.2]
    assert _seen(logits, temperature=1.0, top_k=50) == {0, 1, 2}


def _seen(logits, n=300, **kw):
    g = torch.Generator().manual_seed(0)
    return {sample(torch.tensor(logits), SamplingParams(**kw), g) for _ in range(n)}


def test_top_p_keeps_only_nucleus():
    # p = [0.525, 0.475, ~3e-7, ~3e-7]: top_p 0.5 is reached by token 0 alone
    assert _seen([5.0, 4.9, -10.0, -10.0], temperature=1.0, top_p=0.5) == {0}
    # 0.6 needs both; without top_p tokens 0 and 1 are drawn as well, so this checks no over-filtering
    assert _seen([5.0, 4.9, -10.0, -10.0], temperature=1.0, top_p=0.6) == {0, 1}


def test_top_p_drops_a_token_with_real_probability():
    # p = [0.289, 0.261, 0.236, 0.214]; the first three reach 0.7, token 3 (21%) must never come
    logits = [0.3, 0.2, 0.1, 0.0]
    assert _seen(logits, temperature=1.0) == {0, 1, 2, 3}
    assert _seen(logits, temperature=1.0, top_p=0.7) == {0, 1, 2}
    assert _seen(logits, temperature=1.0, top_p=0.5) == {0, 1}
    # flat: five tokens of 0.2 each, the smallest prefix reaching 0.5 holds three of them
    assert len(_seen([1.0] * 5, temperature=1.0, top_p=0.5)) == 3
    assert len(_seen([1.0] * 5, temperature=1.0)) == 5


@pytest.mark.parametrize("kw", [dict(temperature=-1), dict(top_p=0), dict(top_p=1.5), dict(top_k=-2),
                                dict(max_new_tokens=-1)])
def test_bad_params_rejected(kw):
    with pytest.raises(UsageError):
        SamplingParams(**kw)


def test_top_p_ties_at_the_cut_go_the_way_of_hf_top_p_warper():
    # transformers' TopPLogitsWarper on ten equal logits keeps ids 5-9 at top_p 0.5 and 8-9 at 0.1
    # (its ascending sort drops the lower ids first); salactl used to keep the lowest ids
    assert _seen([1.0] * 10, temperature=1.0, top_p=0.5) == {5, 6, 7, 8, 9}
    assert _seen([1.0] * 10, temperature=1.0, top_p=0.1) == {8, 9}


def test_a_tiny_top_p_still_keeps_the_top_token():
    """A top_p below the top token's probability keeps that token (HF's min_tokens_to_keep=1), never none."""
    logits = torch.randn(1000, generator=torch.Generator().manual_seed(1)) * 3
    g = torch.Generator().manual_seed(0)
    for top_p in (1e-7, 1e-8, 1e-9):
        assert sample(logits, SamplingParams(temperature=1.0, top_p=top_p), g) == int(logits.argmax())


@pytest.mark.parametrize("kw", [dict(max_new_tokens=2.5), dict(top_k=3.0), dict(max_new_tokens=True)])
def test_sampling_params_take_integer_counts_only(kw):
    with pytest.raises(UsageError, match="must be an integer"):
        SamplingParams(**kw)


# a positive temperature below fp32's range samples as its limit does (only the top logits), not NaN
TINY = [1e-300, 1e-320, 5e-324, 1e-40, 1e-45]


@pytest.mark.parametrize("temperature", TINY)
def test_a_tiny_temperature_samples_the_top_logit(temperature):
    logits = torch.randn(4096, generator=torch.Generator().manual_seed(0))
    assert _seen(logits.tolist(), n=20, temperature=temperature) == {int(logits.argmax())}
    assert _seen([1.0, 3.0, 3.0, 2.0], n=60, temperature=temperature) == {1, 2}     # tied tops both drawn


def test_a_tiny_temperature_runs_as_greedy_from_a_flag_or_generation_config(tmp_path, capsys):
    from conftest import run_cli
    from test_generation_config_defaults import nano_with

    def tokens(*args):
        code, out, err = run_cli(["run", "--prompt", "Hi", "-n", "3", "--device", "cpu", "--json", *args], capsys)
        assert code == 0, err
        return json.loads(out)

    greedy = tokens("-t", "0")["output_token_ids"]
    rec = tokens("-t", "1e-300")
    assert rec["output_token_ids"] == greedy and rec["sampling"]["temperature"] == 1e-300
    rec = tokens("--model", nano_with(tmp_path, do_sample=True, temperature=1e-320))
    assert rec["output_token_ids"] == greedy and rec["sampling"]["temperature"] == 1e-320

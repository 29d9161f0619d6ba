"""Chunked prefill, decode and one-shot forward compute the same function (fp32)."""

import pytest
import torch

from salactl.runtime.engine import Engine
from salactl.runtime.sampling import SamplingParams
from conftest import rel_err, tiny_config, tiny_model

PROMPT_LEN = 330          # crosses dense_len = 256 of the nano sparse config


@pytest.fixture(scope="module")
def model():
    return tiny_model(tiny_config(), seed=3)


def prompt(n=PROMPT_LEN, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 512, (n,), generator=g).tolist()


def full_logits(model, ids, chunk):
    eng = Engine(model, "cpu", chunk_size=chunk)
    return eng.prefill(eng.new_sequence(), ids, all_logits=True)


def test_chunk_size_does_not_change_logits(model):
    ids = prompt()
    ref = full_logits(model, ids, len(ids))
    assert model.config.sparse_config.dense_len < len(ids)
    for chunk in (1, 7, 64):
        got = full_logits(model, ids, chunk)
        assert rel_err(got, ref) < 1e-5, chunk


def test_decode_after_prefill_equals_full_forward(model):
    ids = prompt(300, seed=1)
    eng = Engine(model, "cpu", chunk_size=64)
    seq = eng.new_sequence()
    eng.prefill(seq, ids[:240])
    ref = full_logits(model, ids, 300)
    for t in range(240, 300):         # each step crosses or sits past dense_len
        step = eng.forward(seq, [ids[t]])
        assert rel_err(step[-1], ref[t]) < 1e-5, t


def test_greedy_generation_is_deterministic(model):
    eng = Engine(model, "cpu", chunk_size=128)
    a = eng.generate(prompt(50), SamplingParams(max_new_tokens=12)).output_token_ids
    b = eng.generate(prompt(50), SamplingParams(max_new_tokens=12)).output_token_ids
    assert a == b and len(a) == 12


def test_sampling_seed_reproducible_and_params_matter(model):
    """Same seed: the same tokens; the filters change them. This random model's next-token
    distribution is nearly flat (the top 50 of 512 tokens hold ~15% of the mass), so ten draws
    that all land in the top 50 are a ~1e-8 chance without top_k=50."""
    eng = Engine(model, "cpu")
    ids = prompt(20)

    def gen(**kw):
        return eng.generate(ids, SamplingParams(max_new_tokens=10, **kw)).output_token_ids

    a = gen(temperature=1.0, top_p=0.9, top_k=50, seed=7)
    assert a == gen(temperature=1.0, top_p=0.9, top_k=50, seed=7)
    c = gen(temperature=1.0, seed=7)                     # same seed, no filters
    assert a != c
    assert a != gen(temperature=1.0, top_k=50, seed=7) and a != gen(temperature=1.0, top_p=0.9, seed=7)   # each filter
    greedy = gen()
    assert c != greedy
    assert gen(temperature=1.0, top_k=1, seed=7) == greedy     # a nucleus of one token is greedy
    assert gen(temperature=1.0, top_p=1e-6, seed=7) == greedy
    logits = full_logits(model, ids + a[:-1], len(ids) + len(a))[len(ids) - 1:]    # the logits each token was drawn from
    kth = logits.topk(50, dim=-1).values[:, -1]
    picked = logits.gather(1, torch.tensor(a)[:, None])[:, 0]
    assert bool((picked >= kth - 1e-4).all()), "a token outside the top 50 was sampled with top_k=50"
    assert float(torch.softmax(logits[0], -1).topk(50).values.sum()) < 0.3


def test_stops_on_eos(model):
    eng = Engine(model, "cpu")
    first = eng.generate(prompt(20), SamplingParams(max_new_tokens=5)).output_token_ids[0]
    res = eng.generate(prompt(20), SamplingParams(max_new_tokens=5), eos_ids=(first,))
    assert res.output_token_ids == [first] and res.finish_reason == "stop"
    res = eng.generate(prompt(20), SamplingParams(max_new_tokens=5, ignore_eos=True), eos_ids=(first,))
    assert len(res.output_token_ids) == 5


def test_stops_at_the_configs_eos_without_being_told():
    """Engine.generate, like GPUEngine, stops at config.eos_token_id unless ignore_eos."""
    free = Engine(tiny_model(seed=3), "cpu").generate(prompt(20), SamplingParams(max_new_tokens=5, ignore_eos=True))
    eos = free.output_token_ids[1]
    eng = Engine(tiny_model(tiny_config().replace(eos_token_id=(eos,)), seed=3), "cpu")
    res = eng.generate(prompt(20), SamplingParams(max_new_tokens=5))
    assert res.output_token_ids == free.output_token_ids[:2] and res.finish_reason == "stop"
    assert list(eng.stream(prompt(20), SamplingParams(max_new_tokens=5))) == free.output_token_ids[:2]
    assert eng.generate(prompt(20), SamplingParams(max_new_tokens=5, ignore_eos=True)).output_token_ids == \
        free.output_token_ids


def test_bf16_model_runs_and_stays_close_to_fp32():
    m32 = tiny_model(seed=5)
    m16 = tiny_model(seed=5, dtype=torch.bfloat16)
    ids = prompt(80)
    a = full_logits(m32, ids, 32)
    b = full_logits(m16, ids, 32)
    assert b.dtype == torch.float32         # the bf16 lm_head's logits are handed on as fp32
    assert torch.isfinite(b).all() and rel_err(b, a) < 5e-2


def test_prefill_progress_reports_each_chunk(model):
    seen = []
    Engine(model, "cpu", chunk_size=64).generate(prompt(150), SamplingParams(max_new_tokens=1),
                                                  prefill_progress=lambda d, t: seen.append((d, t)))
    assert seen == [(64, 150), (128, 150), (150, 150)]

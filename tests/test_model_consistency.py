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
    eng = Engine(model, "cpu")
    p = SamplingParams(max_new_tokens=10, temperature=1.0, top_p=0.9, top_k=50, seed=7)
    a = eng.generate(prompt(20), p).output_token_ids
    b = eng.generate(prompt(20), p).output_token_ids
    c = eng.generate(prompt(20), SamplingParams(max_new_tokens=10, temperature=1.0, seed=8)).output_token_ids
    assert a == b and a != c


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
    assert torch.isfinite(b).all() and rel_err(b, a) < 5e-2


def test_prefill_progress_reports_each_chunk(model):
    seen = []
    Engine(model, "cpu", chunk_size=64).generate(prompt(150), SamplingParams(max_new_tokens=1),
                                                  prefill_progress=lambda d, t: seen.append((d, t)))
    assert seen == [(64, 150), (128, 150), (150, 150)]

"""Limits of the GPU engine's host logic (pure Python, no triton/CUDA needed): a stop id sampled as
the last allowed token, a request needing exactly max_context tokens, the per-sequence page table
for a max_context that is not a whole number of pages, and the 1 GiB in the activation reserve."""

import pytest

from salactl.errors import CapacityError
from salactl.runtime.gpu.pools import activation_reserve, page_bytes, plan_pools, slot_bytes
from salactl.runtime.presets import sala_9b
from test_gpu_scheduler import _req, _sched


def test_a_stop_id_sampled_as_the_last_allowed_token_finishes_with_stop():
    """As the reference engine says: the stop id wins over the length limit it also reaches."""
    r = _req(0, 3, new=2)                       # stop ids {2}
    assert not r.accept(5) and r.finish_reason is None
    assert r.accept(2) and r.finish_reason == "stop"


def test_a_request_needing_exactly_max_context_tokens_is_admitted():
    s = _sched(pages=100, ctx=1000)
    s.add(_req(0, 997, new=4))                  # 997 + 4 - 1 = 1000 cache tokens: the limit itself
    assert [r.rid for r in s.admit()] == [0]
    with pytest.raises(CapacityError, match="needs 1001 tokens .* holds at most 1000"):
        _sched(pages=100, ctx=1000).add(_req(1, 998, new=4))


def test_max_context_rounds_up_to_whole_pages_per_sequence():
    cfg = sala_9b()
    assert cfg.sparse_config.block_size == 64
    plan = plan_pools(cfg, 100 << 30, 0.9, 4, 1024, max_context=1000)
    assert plan.max_pages_per_seq == 16          # 15 pages hold 960 tokens, 16 hold 1000
    assert plan_pools(cfg, 100 << 30, 0.9, 4, 1024, max_context=1024).max_pages_per_seq == 16


def test_the_activation_reserve_is_one_chunk_of_working_memory_plus_1_gib():
    cfg = sala_9b()
    per_tok = (3 * cfg.intermediate_size + 16 * cfg.hidden_size) * 2     # bf16 activations
    assert activation_reserve(cfg, 8192, 2) == 8192 * per_tok + 2 ** 30
    plan = plan_pools(cfg, 100 << 30, 0.9, 64, 8192)
    assert plan.reserve_bytes == 8192 * per_tok + 2 ** 30
    budget = int((100 << 30) * 0.9) - plan.reserve_bytes - 65 * slot_bytes(cfg)   # + the trash slot
    assert plan.pages == budget // page_bytes(cfg, 2, 2) - 1                      # - the trash page

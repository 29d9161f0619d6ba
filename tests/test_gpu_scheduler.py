"""Host-side logic of the GPU engine (pure Python, runs everywhere): id allocators, pool sizing,
scheduler admission by memory and running limit, chunked prefill planning, stop conditions."""

import pytest

from salactl.errors import CapacityError, UsageError
from salactl.runtime.gpu.pools import IdAllocator, page_bytes, plan_pools, slot_bytes
from salactl.runtime.gpu.scheduler import Request, Scheduler
from salactl.runtime.presets import sala_9b
from salactl.runtime.sampling import SamplingParams


def test_id_allocator_roundtrip_and_errors():
    a = IdAllocator(5, "pages")
    got = a.alloc(3)
    assert got == [0, 1, 2] and a.free == 2
    with pytest.raises(CapacityError, match="out of pages: need 3, 2 free of 5"):
        a.alloc(3)
    a.release(got)
    assert a.free == 5 and sorted(a.alloc(5)) == [0, 1, 2, 3, 4]
    with pytest.raises(ValueError):
        a.release([7])
    with pytest.raises(ValueError):
        a.release([1, 1])
    b = IdAllocator(4, "pages")
    x = b.alloc(1)
    b.release(x)
    with pytest.raises(ValueError, match="already free"):
        b.release(x)                                   # would hand page 0 to two requests
    assert b.free == 4 and sorted(b.alloc(4)) == [0, 1, 2, 3]


def test_pool_sizes_for_the_9b_shapes():
    cfg = sala_9b()
    # 8 sparse layers x (K+V: 2 heads x 64 tokens x 128 x 2 B) + K1 (2 x 4 x 128 x 2 B)
    assert page_bytes(cfg, 2, 2) == 8 * (2 * 2 * 64 * 128 * 2 + 2 * 4 * 128 * 2)
    assert slot_bytes(cfg) == 24 * 32 * 128 * 128 * 4
    plan = plan_pools(cfg, free_bytes=100 << 30, mem_fraction=0.9, max_running=64, chunk_tokens=8192,
                      max_context=1 << 20)
    used = plan.reserve_bytes + (plan.pages + 1) * plan.page_bytes + 65 * plan.slot_bytes
    assert used <= 0.9 * (100 << 30) < used + 2 * plan.page_bytes
    assert plan.max_pages_per_seq == (1 << 20) // 64
    exact = plan_pools(cfg, 100 << 30, 0.9, 1, 8192, kv_tokens=1 << 20)
    assert exact.pages == (1 << 20) // 64


def test_pool_plan_errors_say_what_to_change():
    cfg = sala_9b()
    with pytest.raises(UsageError, match="--mem-fraction"):
        plan_pools(cfg, 10 << 30, 1.5, 4, 1024)
    with pytest.raises(UsageError, match="max_running_requests \\(--max-running-requests\\) must be >= 1"):
        plan_pools(cfg, 10 << 30, 0.9, 0, 1024)
    with pytest.raises(CapacityError, match="--max-running-requests"):
        plan_pools(cfg, 4 << 30, 0.9, 64, 8192)
    with pytest.raises(CapacityError, match="KV cache of 2000000 tokens"):
        plan_pools(cfg, 10 << 30, 0.9, 1, 1024, kv_tokens=2_000_000)


def _req(rid, n, new=4, **kw):
    return Request(rid, list(range(1, n + 1)), SamplingParams(max_new_tokens=new, **kw), frozenset({2}))


def _sched(pages=10, slots=3, max_running=2, chunk=100, ctx=10_000):
    return Scheduler(IdAllocator(pages, "pages"), IdAllocator(slots, "slots"), 64, max_running, chunk, ctx)


def test_admission_by_memory_and_running_limit():
    s = _sched(pages=5, max_running=2)
    s.add(_req(0, 100))      # 103 cache tokens -> 2 pages
    s.add(_req(1, 200))      # 203 -> 4 pages: does not fit next to request 0
    s.add(_req(2, 10))
    assert [r.rid for r in s.admit()] == [0]
    assert s.pages.free == 3 and s.admit() == []          # FIFO: 1 waits for memory, 2 behind it
    s.finish(s.prefilling[0])
    assert [r.rid for r in s.admit()] == [1, 2] and s.running == 2
    assert s.pages.free == 0 and s.slots.free == 1


def test_refuses_requests_that_can_never_fit():
    s = _sched(pages=4, ctx=1000)
    with pytest.raises(CapacityError, match="needs 1003 tokens"):
        s.add(_req(0, 1000))
    with pytest.raises(CapacityError, match="at most 256"):
        _sched(pages=4, ctx=10_000).add(_req(1, 300))


def test_chunked_prefill_plan_shares_the_token_budget():
    s = _sched(pages=20, max_running=3, chunk=100)
    for i, n in enumerate((130, 50, 30)):
        s.add(_req(i, n))
    s.admit()
    plan = s.prefill_plan()
    assert [(r.rid, a, n) for r, a, n in plan] == [(0, 0, 100)]
    assert not s.prefill_done(plan[0][0], 100)
    plan = s.prefill_plan()
    assert [(r.rid, a, n) for r, a, n in plan] == [(0, 100, 30), (1, 0, 50), (2, 0, 20)]
    done = [s.prefill_done(r, n) for r, _, n in plan]
    assert done == [True, True, False] and [r.rid for r in s.prefilling] == [2]


def test_request_stop_conditions():
    r = _req(0, 3, new=3)
    assert not r.accept(5) and not r.accept(6) and r.accept(7) and r.finish_reason == "length"
    r = _req(1, 3, new=5)
    assert not r.accept(5) and r.accept(2) and r.finish_reason == "stop"
    assert r.next_position == 3 + 2 - 1


def test_the_last_sampled_token_needs_no_cache():
    """It is returned, never fed back: prompt 60 + 5 new tokens write 64 positions, one page."""
    s = _sched(pages=1, ctx=10_000)
    s.add(_req(0, 60, new=5))
    assert [r.rid for r in s.admit()] == [0] and s.pages.free == 0
    with pytest.raises(CapacityError, match="needs 65 tokens"):
        _sched(pages=1).add(_req(1, 60, new=6))
    s0 = _sched(pages=1)
    s0.add(_req(2, 64, new=0))
    s0.add(_req(3, 64, new=1))                         # one token out, nothing fed back
    assert s0.pages_for(s0.waiting[1]) == 1


def test_cancel_frees_a_request_wherever_it_is():
    s = _sched(pages=4, slots=2, max_running=1)
    for i in range(2):
        s.add(_req(i, 60))
    running, = s.admit()
    queued = s.waiting[0]
    s.cancel(queued)
    assert not s.waiting and queued.finish_time is not None
    s.cancel(running)
    assert not s.has_work() and s.pages.free == 4 and s.slots.free == 2

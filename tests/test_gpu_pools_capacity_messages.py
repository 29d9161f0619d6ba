"""plan_pools' CapacityError names what takes the memory (GLA state slots, prefill working memory,
the KV cache itself, each with its size) and only knobs that would help: by argument name for an
exact kv_tokens (`salactl run` / `profile` have no --mem-fraction), with bench/sweep's flags when
the pools are sized to the free memory."""

import pytest

from salactl.errors import CapacityError
from salactl.runtime.gpu.pools import plan_pools
from salactl.runtime.presets import sala_9b


def _refusal(*args, **kw) -> str:
    with pytest.raises(CapacityError) as err:
        plan_pools(sala_9b(), *args, **kw)
    return str(err.value)


def test_state_slots_and_prefill_reserve_that_leave_no_kv_room_are_named_as_the_cause():
    msg = _refusal(1 << 30, 0.9, 1, 512, kv_tokens=4000)     # 1 GiB prefill floor > 0.9 GiB usable
    assert msg.startswith("a KV cache of 4000 tokens needs 33.0 MiB: mem_fraction 0.9 of the 1.0 GiB free "
                          "gives 921.6 MiB; the GLA state slots for max_running_requests 1 take 96.0 MiB and "
                          "the prefill working memory for chunk_size 512 takes 1.1 GiB, leaving nothing; ")
    assert msg.endswith("; lower chunk_size, raise mem_fraction, or free GPU memory")
    assert "--" not in msg and "0.0 GiB" not in msg


def test_a_kv_cache_too_big_for_what_is_left_names_kv_tokens_and_no_flags():
    msg = _refusal(10 << 30, 1.0, 2, 1024, kv_tokens=2_000_000)
    assert msg.startswith("a KV cache of 2000000 tokens needs 15.7 GiB: mem_fraction 1 of the 10.0 GiB free")
    assert "leaving 8.6 GiB; lower kv_tokens, chunk_size or max_running_requests, or free GPU memory" in msg
    assert "--" not in msg and "raise mem_fraction" not in msg           # already the whole of free memory


def test_pools_sized_to_free_memory_name_bench_and_sweeps_flags():
    msg = _refusal(4 << 30, 0.9, 64, 8192)
    assert msg.startswith("no room for a KV cache: --mem-fraction 0.9 of the 4.0 GiB free gives 3.6 GiB; the GLA "
                          "state slots for --max-running-requests 64 take 3.0 GiB and the prefill working memory "
                          "for --chunk-size 8192 takes 2.8 GiB, leaving nothing; ")
    assert msg.endswith("; lower --chunk-size or --max-running-requests, raise --mem-fraction, or free GPU memory")

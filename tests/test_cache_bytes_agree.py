"""One set of cache sizes: the memory report's per-request memory, the sweep's per-request cache
bytes and the GPU engine's pages and state slots count the same bytes per token, per compressed
window and per GLA state, with a "bf16"/"auto" KV stored in the activation dtype (fp32 on a float32
model, as the engine allocates it)."""

import pytest

from salactl.bench.grid_memory import cache_bytes_per_request
from salactl.runtime.kv_fp8 import kv_item_bytes
from salactl.reports import memory as mem
from salactl.reports.memory_report import MemoryQuery, build
from salactl.runtime.gpu.pools import page_bytes, slot_bytes
from salactl.runtime.presets import preset

NANO = preset("sala-nano")      # pages of 32 tokens; K1 windows of 16 keys every 8
GLA = 6 * 8 * 32 * 32 * 4       # 6 lightning layers x 8 heads x 32 x 32 fp32


@pytest.mark.parametrize("kv, act, kv_item", [("bf16", 4, 4), ("auto", 4, 4), ("bf16", 2, 2),
                                              ("fp8_e4m3", 4, 1), ("fp8_e5m2", 2, 1)])
@pytest.mark.parametrize("context", [16, 32, 1000, 1024, 4096])
def test_report_sweep_and_engine_pools_count_the_same_cache(kv, act, kv_item, context):
    assert kv_item_bytes(kv, act) == kv_item
    pages = -(-context // 32)
    r = mem.request_memory(NANO, context, kv, "k1", act)
    token = 2 * 2 * 2 * 32 * kv_item            # 2 sparse layers x K,V x 2 KV heads x 32
    window = 2 * 2 * 32 * act                   # one K1 per sparse layer and KV head
    assert r.kv_cache == pages * 32 * token and r.compressed_k1 == pages * 4 * window
    assert r.kv_cache + r.compressed_k1 == pages * page_bytes(NANO, kv_item, act)
    assert r.gla_state == slot_bytes(NANO) == GLA
    # the unpaged count: the context's own tokens and its full windows ((L - 16) // 8 + 1 of them)
    windows = (context - 16) // 8 + 1
    assert cache_bytes_per_request(NANO, context, kv_item, act) == context * token + windows * window + GLA
    # on whole pages they differ by the one window a page slot holds before its keys are all in
    paged = pages * 32
    assert r.total == cache_bytes_per_request(NANO, paged, kv_item, act) + window


def test_brief_example_fp32_activations_with_bf16_kv():
    assert mem.request_memory(NANO, 1000, "bf16", "k1", 4).total == 1024 * 1024 + 128 * 512 + GLA
    assert cache_bytes_per_request(NANO, 1000, 4, 4) == 1000 * 1024 + 124 * 512 + GLA == 1_284_096


def test_planning_names_keep_their_size_and_serving_tables_count_bf16():
    assert mem.kv_bytes_per_elem("bfloat16", 4) == 2 and mem.kv_bytes_per_elem("float32", 2) == 4
    assert mem.kv_bytes_per_elem("bf16") == mem.kv_bytes_per_elem("auto") == 2
    assert mem.kv_bytes_per_token(NANO, "bf16", act_bytes=4) == 2 * mem.kv_bytes_per_token(NANO, "bf16")


def sweep_record(weight_dtype, kv_dtype, peak=50_000_000):
    """A point as salactl/bench/sweep_job.py writes one (grid knobs, then the sweep-wide ones)."""
    return {"schema_version": 1, "kind": "sweep", "run_id": "s1", "label": "s", "profile": "sweep",
            "phase": "p0", "target": "embedded", "model": "sala-nano", "completed": 1, "failed": 0,
            "peak_gpu_memory_bytes": peak,
            "knobs": {"dense_len": 256, "topk": 4, "window": 64, "block": 32, "chunk_size": 512,
                      "batch_size": 2, "kv_dtype": kv_dtype, "weight_dtype": weight_dtype,
                      "input_len": 1000, "output_len": 24, "seed": 0}}


def test_memory_report_predicts_an_fp32_sweep_point_with_bf16_kv_at_4_byte_kv():
    (fp32, bf16) = build(NANO, MemoryQuery(contexts=(4096,)),
                         [sweep_record("fp32", "bf16"), sweep_record("bf16", "bf16")], "sala-nano")["measured"]
    assert (fp32["weights"], fp32["kv_dtype"], fp32["context"], fp32["batch"]) == ("fp32", "bf16", 1024, 2)
    per_request = 1024 * 1024 + 128 * 512 + GLA          # fp32 K, V and K1: as the engine allocates them
    assert fp32["predicted"] == (mem.weight_bytes(NANO, "bf16", 128, 4).total
                                 + mem.prefill_workspace_bytes(NANO, 512, 4) + 2 * per_request)
    per_request_bf16 = 1024 * 512 + 128 * 256 + GLA
    assert bf16["predicted"] == (mem.weight_bytes(NANO, "bf16", 128, 2).total
                                 + mem.prefill_workspace_bytes(NANO, 512, 2) + 2 * per_request_bf16)

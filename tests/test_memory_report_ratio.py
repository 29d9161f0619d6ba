"""The concurrency table's ratio column: how many more requests SALA fits than full attention
(max_requests / max_requests_full_attention), None where full attention fits none."""

from salactl.reports.memory_report import MemoryQuery, build, gpu_list
from salactl.runtime.presets import sala_9b


def test_ratio_is_sala_requests_over_full_attention_requests():
    q = MemoryQuery(contexts=(8192, 131072, 2 << 20), kv_dtypes=("bf16",), weights=("bf16",),
                    gpus=gpu_list(None, 80.0), cuda_graphs=False)
    rows = {c["context"]: c for c in build(sala_9b(), q)["concurrency"]}
    for ctx in (8192, 131072):
        c = rows[ctx]
        sala, full = c["max_requests"], c["max_requests_full_attention"]
        assert sala > full > 0, c               # SALA's sparse KV + GLA state fits more requests
        assert c["ratio"] == sala / full
        assert c["ratio"] > 1
    # 2M tokens: full attention fits no request at all, SALA still fits some -> no ratio
    c = rows[2 << 20]
    assert c["max_requests_full_attention"] == 0 and c["max_requests"] > 0, c
    assert c["ratio"] is None

"""Analytic cache bytes one request holds at a given length, unpaged (the reference engine's
cache): KV of the sparse layers (activation dtype or FP8), their compressed keys (K1, activation
dtype) and the fp32 GLA states of the lightning layers (reference/architecture.md §5 gives 8 KiB/token
KV in bf16 for the 9B model, 48 MiB of state), each counted as the GPU engine's page pool sizes it
(runtime/gpu/pools.py)."""

from __future__ import annotations

from salactl.runtime.gpu.pools import k1_window_bytes, kv_token_bytes, slot_bytes
from salactl.runtime.ops.selection import num_windows


def cache_bytes_per_request(config, tokens: int, kv_itemsize: int, act_itemsize: int) -> int:
    return (tokens * kv_token_bytes(config, kv_itemsize)
            + num_windows(tokens, config.sparse_config) * k1_window_bytes(config, act_itemsize)
            + slot_bytes(config))

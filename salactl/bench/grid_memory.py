"""Analytic cache bytes one request holds at a given length: KV of the sparse layers (bf16 or
FP8), their compressed keys (K1, activation dtype) and the fp32 GLA states of the lightning layers
(reference/architecture.md §5 gives 8 KiB/token KV in bf16 for the 9B model, 48 MiB of state)."""

from __future__ import annotations


def cache_bytes_per_request(config, tokens: int, kv_itemsize: int, act_itemsize: int) -> int:
    sc = config.sparse_config
    hkv, d = config.num_key_value_heads, config.head_dim
    sparse = len(config.sparse_layers)
    kv = 2 * hkv * d * kv_itemsize * tokens * sparse
    windows = max(0, (tokens - sc.kernel_size) // sc.kernel_stride + 1)
    k1 = windows * hkv * d * act_itemsize * sparse
    gla = len(config.lightning_layers) * config.lightning_nh * config.lightning_head_dim ** 2 * 4
    return kv + k1 + gla

"""Per-sequence caches of the reference backend: contiguous KV + compressed keys for the sparse
layers, one fp32 [H, K, V] state per lightning layer. (The GPU engine uses paged pools instead.)"""

from __future__ import annotations

import torch

from salactl.runtime.config import SalaConfig
from salactl.runtime.ops.selection import compress_keys, num_windows


class SequenceCache:
    def __init__(self, config: SalaConfig, device, dtype, capacity: int = 256):
        self.config, self.device, self.dtype = config, torch.device(device), dtype
        self.length = 0
        hkv, d = config.num_key_value_heads, config.head_dim
        self._k = {i: torch.empty(capacity, hkv, d, device=device, dtype=dtype) for i in config.sparse_layers}
        self._v = {i: torch.empty(capacity, hkv, d, device=device, dtype=dtype) for i in config.sparse_layers}
        self._k1 = {i: torch.empty(0, hkv, d, device=device, dtype=dtype) for i in config.sparse_layers}
        h, dk = config.lightning_nh, config.lightning_head_dim
        self.state = {i: torch.zeros(h, dk, dk, device=device, dtype=torch.float32)
                      for i in config.lightning_layers}

    def append_kv(self, layer: int, k: torch.Tensor, v: torch.Tensor):
        """Write the new tokens' keys/values at [length, length+n); return all keys/values so far."""
        end = self.length + k.shape[0]
        if end > self._k[layer].shape[0]:
            cap = max(end, 2 * self._k[layer].shape[0])
            for store in (self._k, self._v):
                grown = torch.empty(cap, *store[layer].shape[1:], device=self.device, dtype=self.dtype)
                grown[: self.length] = store[layer][: self.length]
                store[layer] = grown
        self._k[layer][self.length:end] = k
        self._v[layer][self.length:end] = v
        return self._k[layer][:end], self._v[layer][:end]

    def compressed_keys(self, layer: int, keys: torch.Tensor) -> torch.Tensor:
        """K1 for every full window of `keys`, computing only the windows not cached yet."""
        have, need = self._k1[layer].shape[0], num_windows(keys.shape[0], self.config.sparse_config)
        if need > have:
            new = compress_keys(keys, self.config.sparse_config, have, need)
            self._k1[layer] = torch.cat([self._k1[layer], new])
        return self._k1[layer][:need]

    def kv_bytes(self) -> int:
        per_tok = 2 * self.config.num_key_value_heads * self.config.head_dim * self.dtype.itemsize
        return per_tok * self.length * len(self._k)

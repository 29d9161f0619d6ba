"""Per-sequence caches of the reference backend: contiguous KV + compressed keys for the sparse
layers, one fp32 [H, K, V] state per lightning layer. (The GPU engine uses paged pools instead.)"""

from __future__ import annotations

import torch

from salactl.runtime.config import SalaConfig
from salactl.runtime.kv_fp8 import KVScales, dequantize_kv, fp8_dtype, quantize_kv, resolve_kv_scales
from salactl.runtime.ops.selection import compress_keys, num_windows


class SequenceCache:
    def __init__(self, config: SalaConfig, device, dtype, capacity: int = 256, kv_cache_dtype: str = "bf16",
                 kv_scales: KVScales | None = None, layers=None):
        """kv_cache_dtype: bf16/auto (activation dtype) or fp8_e4m3/fp8_e5m2 (runtime/kv_fp8.py),
        with `kv_scales` from resolve_kv_scales; `layers` restricts storage to those layers."""
        self.config, self.device, self.dtype = config, torch.device(device), dtype
        self.length = 0
        self.kv_dtype = fp8_dtype(kv_cache_dtype) or dtype
        self.kv_scales = None
        if self.kv_dtype != dtype:
            self.kv_scales = kv_scales or resolve_kv_scales(config, kv_cache_dtype, None, device)
        keep = (lambda i: True) if layers is None else (lambda i: i in layers)
        sparse = [i for i in config.sparse_layers if keep(i)]
        hkv, d = config.num_key_value_heads, config.head_dim
        self._k = {i: torch.empty(capacity, hkv, d, device=device, dtype=self.kv_dtype) for i in sparse}
        self._v = {i: torch.empty(capacity, hkv, d, device=device, dtype=self.kv_dtype) for i in sparse}
        self._k1 = {i: torch.empty(0, hkv, d, device=device, dtype=dtype) for i in sparse}
        h, dk = config.lightning_nh, config.lightning_head_dim
        self.state = {i: torch.zeros(h, dk, dk, device=device, dtype=torch.float32)
                      for i in config.lightning_layers if keep(i)}

    def append_kv(self, layer: int, k: torch.Tensor, v: torch.Tensor):
        """Write the new tokens' keys/values at [length, length+n); return all keys/values so far as
        stored: FP8 in an FP8 cache, which `dequantized` or the layer's `scales` turn into values."""
        end = self.length + k.shape[0]
        if end > self._k[layer].shape[0]:
            cap = max(end, 2 * self._k[layer].shape[0])
            for store in (self._k, self._v):
                grown = torch.empty(cap, *store[layer].shape[1:], device=self.device, dtype=self.kv_dtype)
                grown[: self.length] = store[layer][: self.length]
                store[layer] = grown
        if self.kv_scales is not None:
            ks, vs = self.kv_scales[layer]
            self._k[layer][self.length:end] = quantize_kv(k, ks, self.kv_dtype)
            self._v[layer][self.length:end] = quantize_kv(v, vs, self.kv_dtype)
        else:
            self._k[layer][self.length:end] = k
            self._v[layer][self.length:end] = v
        return self._k[layer][:end], self._v[layer][:end]

    def scales(self, layer: int):
        """(k_scale [Hkv], v_scale [Hkv]) fp32 of an FP8 cache's layer; None when stored as values."""
        return None if self.kv_scales is None else self.kv_scales[layer]

    def dequantized(self, layer: int, keys: torch.Tensor, values: torch.Tensor):
        """Stored keys/values [n, Hkv, d] (any token range) as values in the activation dtype."""
        if self.kv_scales is None:
            return keys, values
        ks, vs = self.kv_scales[layer]
        return dequantize_kv(keys, ks, self.dtype), dequantize_kv(values, vs, self.dtype)

    def compressed_keys(self, layer: int, keys: torch.Tensor) -> torch.Tensor:
        """K1 for every full window of the stored `keys`, computing (and dequantizing the keys of)
        only the windows not cached yet."""
        sc = self.config.sparse_config
        have, need = self._k1[layer].shape[0], num_windows(keys.shape[0], sc)
        if need > have:
            span = keys[have * sc.kernel_stride:(need - 1) * sc.kernel_stride + sc.kernel_size]
            if self.kv_scales is not None:
                span = dequantize_kv(span, self.kv_scales[layer][0], self.dtype)
            self._k1[layer] = torch.cat([self._k1[layer], compress_keys(span, sc, 0, need - have)])
        return self._k1[layer][:need]

    def drop_compressed_keys_past(self, windows: int) -> None:
        """Keep the first `windows` K1 windows of every layer (a view: no copy); a caller that ran
        an uncommitted step (profile's repeated steps) drops the windows that step compressed."""
        for layer, k1 in self._k1.items():
            if k1.shape[0] > windows:
                self._k1[layer] = k1[:windows]

    def kv_bytes(self) -> int:
        per_tok = 2 * self.config.num_key_value_heads * self.config.head_dim * self.kv_dtype.itemsize
        return per_tok * self.length * len(self._k)

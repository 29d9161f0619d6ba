"""Cache memory of the GPU engine: page/slot allocators (host bookkeeping), the pool sizing plan,
and the device tensors.

- KV pool of the sparse layers: head-major pages [layers, P+1, Hkv, B, D] (B = InfLLM block, so a
  selected block is exactly one page; FP8 V pages are token-minor, [.., D, B]: see
  ops/decode_attention/reference.py); compressed keys K1 [layers, P+1, Hkv, B/stride, D] beside
  them (window j lives in the page of its first token).
- fp32 GLA state pool [lightning layers, S+1, H, K, V]: one slot per running request.
- page table [S+1, max_pages] int32: logical block b of the request in slot s is page_table[s, b].
Page P and slot S are trash targets for the padding rows of a CUDA-graph batch, so a padded row
never touches a live request's memory.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from salactl.errors import CapacityError, UsageError
from salactl.runtime.config import SalaConfig
from salactl.runtime.gpu.mem_fraction import check_mem_fraction
from salactl.runtime.ops.decode_attention.reference import v_token_minor


class IdAllocator:
    """Free-list of integer ids [0, total)."""

    def __init__(self, total: int, what: str):
        self.total, self.what = total, what
        self._free = list(range(total - 1, -1, -1))
        self._is_free = set(self._free)           # a double release would hand one id out twice

    @property
    def free(self) -> int:
        return len(self._free)

    def alloc(self, n: int = 1) -> list[int]:
        if n > len(self._free):
            raise CapacityError(f"out of {self.what}: need {n}, {len(self._free)} free of {self.total}")
        out = self._free[-n:][::-1] if n else []
        del self._free[len(self._free) - n:]
        self._is_free.difference_update(out)
        return out

    def release(self, ids) -> None:
        ids = list(ids)
        if (len(set(ids)) != len(ids) or any(not 0 <= i < self.total for i in ids)
                or not self._is_free.isdisjoint(ids)):
            raise ValueError(f"bad {self.what} ids to release (duplicate, out of range or already free): {ids}")
        self._free.extend(reversed(ids))
        self._is_free.update(ids)


@dataclass(frozen=True)
class PoolPlan:
    pages: int
    slots: int
    max_pages_per_seq: int
    page_bytes: int
    slot_bytes: int
    reserve_bytes: int
    block_size: int

    def total_bytes(self) -> int:
        return (self.pages + 1) * self.page_bytes + (self.slots + 1) * self.slot_bytes


def kv_token_bytes(config: SalaConfig, kv_itemsize: int, layers: int | None = None) -> int:
    """K and V of one token in every sparse layer (or in `layers` layers), every KV head."""
    n = len(config.sparse_layers) if layers is None else layers
    return n * 2 * config.num_key_value_heads * config.head_dim * kv_itemsize


def k1_window_bytes(config: SalaConfig, key_itemsize: int) -> int:
    """One compressed key (a K1, or K2, window) in every sparse layer and KV head."""
    return len(config.sparse_layers) * config.num_key_value_heads * config.head_dim * key_itemsize


def page_bytes(config: SalaConfig, kv_itemsize: int, act_itemsize: int) -> int:
    """One KV page: block_size tokens of K and V, and the block_size / stride K1 windows beside them."""
    sc = config.sparse_config
    return (sc.block_size * kv_token_bytes(config, kv_itemsize)
            + sc.block_size // sc.kernel_stride * k1_window_bytes(config, act_itemsize))


def slot_bytes(config: SalaConfig) -> int:
    """One GLA state slot: a request's fp32 [H, K, V] state in every lightning layer."""
    d = config.lightning_head_dim
    return len(config.lightning_layers) * config.lightning_nh * d * d * 4


def activation_reserve(config: SalaConfig, chunk_tokens: int, act_itemsize: int) -> int:
    """Working memory of one prefill chunk (MLP, projections, attention temporaries) + 1 GiB."""
    per_tok = (3 * config.intermediate_size + 16 * config.hidden_size) * act_itemsize
    return chunk_tokens * per_tok + (1 << 30)


def plan_pools(config: SalaConfig, free_bytes: int, mem_fraction: float, max_running: int,
               chunk_tokens: int, kv_itemsize: int = 2, act_itemsize: int = 2,
               max_context: int | None = None, kv_tokens: int | None = None) -> PoolPlan:
    """Size the pools from free GPU memory. kv_tokens (optional) asks for an exact KV capacity."""
    check_mem_fraction(mem_fraction)
    if max_running < 1:
        raise UsageError(f"max_running_requests (--max-running-requests) must be >= 1, got {max_running}")
    B = config.sparse_config.block_size
    pb, sb = page_bytes(config, kv_itemsize, act_itemsize), slot_bytes(config)
    reserve = activation_reserve(config, chunk_tokens, act_itemsize)
    usable, states = int(free_bytes * mem_fraction), (max_running + 1) * sb
    pages_fit = (usable - reserve - states) // pb - 1          # one more page is the trash page
    pages = pages_fit if kv_tokens is None else math.ceil(kv_tokens / B)
    if pages_fit < 1 or pages > pages_fit:
        raise CapacityError(_no_room(kv_tokens, (pages + 1) * pb, pages_fit >= 1, free_bytes, mem_fraction,
                                     usable, max_running, states, chunk_tokens, reserve))
    ctx_pages = pages if max_context is None else min(pages, math.ceil(max_context / B))
    return PoolPlan(pages, max_running, ctx_pages, pb, sb, reserve, B)


def _no_room(kv_tokens, kv_bytes, some_kv_fits, free_bytes, mem_fraction, usable, max_running, states,
             chunk_tokens, reserve) -> str:
    """What takes the memory and which engine arguments would make the pools fit. An exact kv_tokens
    comes from `salactl run` / `profile`, which size the engine themselves (no --mem-fraction or
    --max-running-requests there): that advice names arguments only; sizing to the free memory is
    what bench and sweep ask for, and that advice names their flags too."""
    from salactl.units import human_bytes as hb

    what = "no room for a KV cache" if kv_tokens is None else f"a KV cache of {kv_tokens} tokens needs {hb(kv_bytes)}"
    left = usable - states - reserve

    def knob(name: str) -> str:         # bench and sweep (sizing to free memory) have these flags
        return name if kv_tokens is not None else f"--{name.replace('_', '-')}"

    budget = (f"{knob('mem_fraction')} {mem_fraction:g} of the {hb(free_bytes)} free gives {hb(usable)}; the GLA "
              f"state slots for {knob('max_running_requests')} {max_running} take {hb(states)} and the prefill "
              f"working memory for {knob('chunk_size')} {chunk_tokens} takes {hb(reserve)}, leaving "
              f"{hb(left) if left > 0 else 'nothing'}")
    lower = ["kv_tokens"] * some_kv_fits + ["chunk_size"] + ["max_running_requests"] * (max_running > 1)
    higher = ["mem_fraction"] * (mem_fraction < 1)
    lower, higher = ([knob(k) for k in names] for names in (lower, higher))
    advice = f"lower {', '.join(lower[:-1])} or {lower[-1]}" if len(lower) > 1 else f"lower {lower[0]}"
    advice += "".join(f", raise {k}" for k in higher)
    return f"{what}: {budget}; {advice}, or free GPU memory"


class CachePools:
    """The device tensors of a PoolPlan."""

    def __init__(self, config: SalaConfig, plan: PoolPlan, device, act_dtype, kv_dtype=None):
        sc = config.sparse_config
        self.config, self.plan = config, plan
        self.kv_dtype = kv_dtype or act_dtype
        hkv, d = config.num_key_value_heads, config.head_dim
        ls, P = len(config.sparse_layers), plan.pages + 1
        self.trash_page, self.trash_slot = plan.pages, plan.slots
        self.k = torch.zeros(ls, P, hkv, sc.block_size, d, device=device, dtype=self.kv_dtype)
        if v_token_minor(self.kv_dtype):
            self.v = torch.zeros(ls, P, hkv, d, sc.block_size, device=device, dtype=self.kv_dtype)
        else:
            self.v = torch.zeros_like(self.k)
        self.k1 = torch.zeros(ls, P, hkv, sc.block_size // sc.kernel_stride, d, device=device, dtype=act_dtype)
        h, dk = config.lightning_nh, config.lightning_head_dim
        self.state = torch.zeros(len(config.lightning_layers), plan.slots + 1, h, dk, dk,
                                 device=device, dtype=torch.float32)
        self.page_table = torch.full((plan.slots + 1, plan.max_pages_per_seq), self.trash_page,
                                     device=device, dtype=torch.int32)
        # fp32 [Hkv] scales per sparse layer for FP8 KV (ones otherwise); set by the engine
        self.k_scale = [torch.ones(hkv, device=device) for _ in range(ls)]
        self.v_scale = [torch.ones(hkv, device=device) for _ in range(ls)]

    def nbytes(self) -> int:
        """Device bytes the pools hold: KV, compressed keys, GLA states, page table, FP8 scales."""
        return sum(t.nbytes for t in (self.k, self.v, self.k1, self.state, self.page_table, *self.k_scale,
                                      *self.v_scale))

    def clear_pages(self, pages: list[int]) -> None:
        """Zero the K, V and compressed keys of `pages` in every sparse layer, for a newly admitted
        request: attention masks the tokens past a row's length in the scores only, so their zero
        weights still multiply the V an earlier owner left in the tail of the last, partly filled
        page, and 0 x NaN = NaN (from a request that failed with NaN logits, or was aborted or
        finished before its NaN was sampled) would fail the new owner. Costs one write of the
        request's reserved KV bytes at admission, e.g. ~30 MB (~10 us) for a 4K-token sala-9b request."""
        if not pages:
            return
        idx = torch.tensor(pages, device=self.k.device)
        for t in (self.k, self.v, self.k1):      # fp8 has no index_fill: zero bytes are +0.0 there too
            (t.view(torch.uint8) if t.element_size() == 1 else t).index_fill_(1, idx, 0)

    def assign_pages(self, slot: int, pages: list[int]) -> None:
        row = torch.full((self.plan.max_pages_per_seq,), self.trash_page, dtype=torch.int32)
        row[:len(pages)] = torch.tensor(pages, dtype=torch.int32)
        self.page_table[slot].copy_(row.to(self.page_table.device))

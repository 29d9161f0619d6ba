"""GPU attention backend: the two methods the (unchanged) layers call, over paged caches.

softmax_attention (minicpm4 layers): store K/V in the page pool, then
  - decode: split-K paged attention over all pages (dense) or, when the batch has rows past
    dense_len, over the InfLLM-V2 blocks selected on the GPU (compressed keys updated in place);
  - prefill: queries with t+1 < dense_len by SDPA (GQA, causal over cached prefix + chunk);
    later queries per token through the GPU selection + the paged kernel over their blocks.
linear_attention (lightning layers): the in-place Triton decode step on the fp32 state pool,
or fla's chunked prefill for multi-token segments.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from salactl.runtime.config import SalaConfig
from salactl.runtime.ops.attention import flex_sparse
from salactl.runtime.ops.decode_attention.reference import is_fp8, v_rows
from salactl.runtime.ops.decode_attention.config import choose_splits
from salactl.runtime.ops.decode_attention.triton import paged_attention, store_kv
from salactl.runtime.ops.gla.triton import gla_decode_, gla_prefill_
from salactl.runtime.ops.selection import num_windows
from salactl.runtime.ops.selection.gpu import check_shapes, compress_update, select_decode, select_paged


class GPUBackend:
    name = "gpu"

    def __init__(self, config: SalaConfig, pools, num_sms: int = 132, sparse_sub: int = 2048,
                 gla_max_chunk: int = 32768, sparse_prefill: str | None = None):
        check_shapes(config)
        # "triton" (paged kernel per query token) or "flex" (FlexAttention over 128-row tiles);
        # default from the measured table in runtime/ops/attention/flex_sparse.py
        self.sparse_prefill = sparse_prefill or flex_sparse.SPARSE_PREFILL_DEFAULT
        if self.sparse_prefill not in ("triton", "flex"):
            raise ValueError(f"sparse_prefill must be 'triton' or 'flex', got {self.sparse_prefill!r}")
        if self.sparse_prefill == "flex" and is_fp8(pools.k.dtype):
            raise ValueError("sparse_prefill='flex' needs bf16/fp16/fp32 KV pages; use 'triton' with FP8 KV")
        self.config, self.pools = config, pools
        self.sparse_index = {l: i for i, l in enumerate(config.sparse_layers)}
        self.light_index = {l: i for i, l in enumerate(config.lightning_layers)}
        self.k1_have = [0] * (pools.plan.slots + 1)     # compressed windows per slot (host)
        self.num_sms, self.sparse_sub, self.gla_max_chunk = num_sms, sparse_sub, gla_max_chunk
        self._pending_k1: dict[int, int] = {}

    # ---- K1 bookkeeping ---------------------------------------------------------------------
    def catch_up_k1(self, slot: int, length: int) -> None:
        """Compress every full window of the first `length` cached tokens (all sparse layers)."""
        sc = self.config.sparse_config
        have, need = self.k1_have[slot], num_windows(length, sc)
        if need <= have:
            return
        dev = self.pools.k.device
        slots = torch.tensor([slot], dtype=torch.int32, device=dev)
        start = torch.tensor([have], dtype=torch.int32, device=dev)
        count = torch.tensor([need - have], dtype=torch.int32, device=dev)
        for li in range(len(self.config.sparse_layers)):
            compress_update(self.pools.k[li], self.pools.k1[li], self.pools.page_table, slots, start,
                            count, need - have, sc, self.pools.k_scale[li])
        self.k1_have[slot] = need

    # ---- softmax layers ---------------------------------------------------------------------
    def softmax_attention(self, layer, q, k, v, batch):
        li = self.sparse_index[layer]
        p = self.pools
        kp, vp, pt = p.k[li], p.v[li], p.page_table
        ks, vs = p.k_scale[li], p.v_scale[li]
        store_kv(kp, vp, k, v, pt, batch.slots, batch.seq_lens, ks, vs)
        if batch.decode:
            return self._decode_attention(li, q, batch)
        return self._prefill_attention(li, q, k, v, batch)

    def _decode_attention(self, li, q, batch):
        p, sc = self.pools, self.config.sparse_config
        kp, vp, k1p, pt = p.k[li], p.v[li], p.k1[li], p.page_table
        rows = q.shape[0] * self.config.num_key_value_heads
        kw = dict(k_scale=p.k_scale[li], v_scale=p.v_scale[li])
        if batch.sparse:
            sel, cnt = select_decode(q, k1p, pt, batch.slots, batch.seq_lens, sc, pt.shape[1], k_pages=kp,
                                     k1_start=batch.k1_start, k1_count=batch.k1_count, k_scale=p.k_scale[li])
            return paged_attention(q, kp, vp, pt, batch.slots, batch.seq_lens, sel, cnt, sc.dense_len,
                                   num_splits=choose_splits(rows, sc.selected_blocks, self.num_sms, kp.dtype), **kw)
        return paged_attention(q, kp, vp, pt, batch.slots, batch.seq_lens,
                               num_splits=choose_splits(rows, pt.shape[1], self.num_sms, kp.dtype), **kw)

    def _prefill_attention(self, li, q, k, v, batch):
        p, sc, B = self.pools, self.config.sparse_config, self.config.sparse_config.block_size
        kp, vp, k1p, pt = p.k[li], p.v[li], p.k1[li], p.page_table
        o = torch.empty_like(q)
        for seg in batch.segments:
            r0, n, p0 = seg.row0, seg.n, seg.pos0
            nd = min(max(sc.dense_len - 1 - p0, 0), n)
            if nd:
                o[r0:r0 + nd] = self._dense_prefill(li, q[r0:r0 + nd], k[r0:r0 + nd], v[r0:r0 + nd],
                                                    seg.slot, p0)
            if nd == n:
                continue
            self._layer_k1(li, seg.slot, p0 + n)
            if self.sparse_prefill == "flex":
                rows = slice(r0 + nd, r0 + n)
                o[rows] = self._flex_prefill(li, q[rows], batch.slots[rows], batch.seq_lens[rows], seg.slot, p0 + nd)
                continue
            for s0 in range(r0 + nd, r0 + n, self.sparse_sub):
                s1 = min(s0 + self.sparse_sub, r0 + n)
                qs, slots, lens = q[s0:s1], batch.slots[s0:s1], batch.seq_lens[s0:s1]
                nb = math.ceil((p0 + s1 - r0) / B)
                sel, cnt = select_paged(qs, k1p, pt, slots, lens, sc, nb, one_sequence=True)
                paged_attention(qs, kp, vp, pt, slots, lens, sel, cnt, 0, k_scale=p.k_scale[li],
                                v_scale=p.v_scale[li], num_splits=1, out=o[s0:s1])
        return o

    def _flex_prefill(self, li, q, slots, lens, slot, pos0):
        """Selection per sub-chunk (bounded key buffer), then one FlexAttention call."""
        p, sc, B = self.pools, self.config.sparse_config, self.config.sparse_config.block_size
        kp, k1p, pt = p.k[li], p.k1[li], p.page_table
        m, hkv = q.shape[0], kp.shape[1]
        width = min(sc.selected_blocks, math.ceil((pos0 + m) / B))   # select_paged's widest answer
        sel = torch.zeros(m, hkv, width, dtype=torch.int32, device=q.device)
        cnt = torch.empty(m, hkv, dtype=torch.int32, device=q.device)
        for s0 in range(0, m, self.sparse_sub):
            s1 = min(s0 + self.sparse_sub, m)
            a, c = select_paged(q[s0:s1], k1p, pt, slots[s0:s1], lens[s0:s1], sc,
                                math.ceil((pos0 + s1) / B), one_sequence=True)
            sel[s0:s1, :, :a.shape[-1]], cnt[s0:s1] = a, c
        inp = flex_sparse.build_inputs(sel, cnt, pt[slot], pos0, m, kp.shape[0], q.shape[1], B,
                                       flex_sparse.FLEX_FOLD, pad_to=self.sparse_sub)
        return flex_sparse.sparse_attention(flex_sparse.compiled_flex(q.device), q, kp, p.v[li], inp,
                                            flex_sparse.kernel_options(B))

    def _layer_k1(self, li, slot, length):
        """This layer's windows missing for `length` tokens; end_forward() commits the count."""
        sc = self.config.sparse_config
        have, need = self.k1_have[slot], num_windows(length, sc)
        if need > have:
            t = torch.tensor([[slot], [have], [need - have]], dtype=torch.int32, device=self.pools.k.device)
            compress_update(self.pools.k[li], self.pools.k1[li], self.pools.page_table, t[0], t[1], t[2],
                            need - have, sc, self.pools.k_scale[li])
        self._pending_k1[slot] = max(need, self._pending_k1.get(slot, 0))

    def end_forward(self) -> None:
        """After a prefill forward: windows computed for every layer are now cached."""
        for slot, need in self._pending_k1.items():
            self.k1_have[slot] = max(self.k1_have[slot], need)
        self._pending_k1.clear()

    def cancel_forward(self) -> None:
        """After a prefill forward that raised: its windows reached only some layers, so none count."""
        self._pending_k1.clear()

    def release_slot(self, slot: int) -> None:
        self.k1_have[slot] = 0
        self._pending_k1.pop(slot, None)

    def _dense_prefill(self, li, q, k_new, v_new, slot, p0):
        """Causal GQA attention for queries at positions p0.. over cached keys [0, p0) + new, as
        stored: FP8 pages are read back even for a first chunk, so the result does not depend on
        the chunk size (the reference Engine attends its stored cache too)."""
        nd = q.shape[0]
        qh = q.transpose(0, 1).unsqueeze(0)
        p = self.pools
        if p0 == 0 and p.k.dtype == q.dtype:       # the new keys are exactly what was stored
            kh, vh = k_new.transpose(0, 1).unsqueeze(0), v_new.transpose(0, 1).unsqueeze(0)
        else:
            L = p0 + nd
            pages = p.page_table[slot, :math.ceil(L / self.config.sparse_config.block_size)].long()
            kh, vh = (self._gather(pool, pages, L, scale, q.dtype)
                      for pool, scale in ((p.k[li], p.k_scale[li]), (v_rows(p.v[li]), p.v_scale[li])))
        if p0 == 0:
            out = F.scaled_dot_product_attention(qh, kh, vh, is_causal=True, enable_gqa=True)
        else:
            mask = (torch.arange(L, device=q.device)[None, :]
                    <= (p0 + torch.arange(nd, device=q.device))[:, None])
            g = q.shape[1] // kh.shape[1]          # masked SDPA kernels take no GQA: expand heads
            kh, vh = kh.repeat_interleave(g, dim=1), vh.repeat_interleave(g, dim=1)
            out = F.scaled_dot_product_attention(qh, kh, vh, attn_mask=mask)
        return out[0].transpose(0, 1)

    @staticmethod
    def _gather(pool, pages, L, scale, dtype):
        x = pool[pages].transpose(0, 1).reshape(pool.shape[1], -1, pool.shape[-1])[:, :L]
        if x.dtype != dtype:
            x = (x.float() * scale[:, None, None]).to(dtype)
        return x.unsqueeze(0)

    # ---- lightning layers -------------------------------------------------------------------
    def linear_attention(self, layer, q, k, v, g_gamma, scale, batch):
        pool = self.pools.state[self.light_index[layer]]
        if batch.decode:
            return gla_decode_(q, k, v, g_gamma, scale, pool, batch.slots)
        o = torch.empty(q.shape[0], q.shape[1], v.shape[-1], device=q.device, dtype=q.dtype)
        for seg in batch.segments:
            rows = slice(seg.row0, seg.row0 + seg.n)
            if seg.n == 1:
                o[rows] = gla_decode_(q[rows], k[rows], v[rows], g_gamma, scale, pool, batch.slots[rows])
            else:
                o[rows] = gla_prefill_(q[rows], k[rows], v[rows], g_gamma, scale, pool, seg.slot,
                                       self.gla_max_chunk)
        return o

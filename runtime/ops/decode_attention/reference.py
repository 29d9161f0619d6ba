"""Paged decode attention, plain PyTorch (the contract for the Triton kernel beside it).

Pools are head-major pages: k_pages [num_pages, Hkv, B, D] (bf16, fp32 or FP8 with a fp32 scale
per layer, scalar or per KV head) and v_pages of the same shape, except that FP8 V pages are
token-minor, [num_pages, Hkv, D, B] (`v_token_minor`): the decode kernel's P·V MMA contracts over
tokens and needs token pairs in one register; 16-bit pages get them from a transposing ldmatrix,
which does not exist for 8-bit data, so FP8 V is stored transposed instead (the sm_90 SASS of the
kernel otherwise gathers V from shared memory one byte at a time).

A query row n (one token, Hq heads) belongs to the sequence in slot `slots[n]` whose logical block
b lives in page `page_table[slot, b]`; it sees the keys at positions < seq_lens[n]. Each (row, KV
head) attends either all its blocks (dense) or, when seq_lens[n] >= dense_len, only
`block_ids[n, h, :num_blocks[n, h]]` (sparse). Computed in fp32; returns o [n, Hq, D] in q's dtype.
"""

from __future__ import annotations

import math

import torch


def is_fp8(dtype) -> bool:
    """Whether KV pages of this dtype are FP8 (e4m3 or e5m2)."""
    return dtype in (torch.float8_e4m3fn, torch.float8_e5m2)


def v_token_minor(dtype) -> bool:
    """Whether V pages of this dtype are stored [.., D, B] (FP8) rather than [.., B, D]."""
    return is_fp8(dtype)


def pack_v_pages(v_pages: torch.Tensor) -> torch.Tensor:
    """[.., B, D] V pages -> the stored layout of their dtype."""
    return v_pages.transpose(-1, -2).contiguous() if v_token_minor(v_pages.dtype) else v_pages


def v_rows(v_pages: torch.Tensor) -> torch.Tensor:
    """Stored V pages -> a [.., B, D] view (no copy)."""
    return v_pages.transpose(-1, -2) if v_token_minor(v_pages.dtype) else v_pages


def paged_attention(q, k_pages, v_pages, page_table, slots, seq_lens, block_ids=None,
                    num_blocks=None, dense_len: int | None = None, k_scale=1.0, v_scale=1.0,
                    sm_scale: float | None = None):
    n, hq, d = q.shape
    _, hkv, B, _ = k_pages.shape
    g = hq // hkv
    sm_scale = sm_scale if sm_scale is not None else 1.0 / math.sqrt(d)
    out = torch.empty(n, hq, d, dtype=torch.float32, device=q.device)
    ks = torch.as_tensor(k_scale, dtype=torch.float32, device=q.device).reshape(-1).expand(hkv)
    vs = torch.as_tensor(v_scale, dtype=torch.float32, device=q.device).reshape(-1).expand(hkv)
    for i in range(n):
        slot, L = int(slots[i]), int(seq_lens[i])
        sparse = block_ids is not None and dense_len is not None and L >= dense_len
        for h in range(hkv):
            if sparse:
                blocks = [int(b) for b in block_ids[i, h, :int(num_blocks[i, h])]]
            else:
                blocks = list(range(math.ceil(L / B)))
            pages = page_table[slot, blocks].long()
            keys = k_pages[pages, h].float().reshape(-1, d) * ks[h]     # [nb·B, d]
            vals = v_rows(v_pages)[pages, h].float().reshape(-1, d) * vs[h]
            pos = (torch.tensor(blocks, device=q.device)[:, None] * B
                   + torch.arange(B, device=q.device)[None, :]).reshape(-1)
            scores = q[i, h * g:(h + 1) * g].float() @ keys.T * sm_scale       # [g, nb·B]
            scores = scores.masked_fill(pos[None, :] >= L, float("-inf"))
            out[i, h * g:(h + 1) * g] = torch.softmax(scores, dim=-1) @ vals
    return out.to(q.dtype)

"""Sparse rows' attention over the tokens of their kept blocks only (DESIGN.md §2 step 5).

reference.attention with `sparse_token_mask` is the definition: it scores every cached key and masks
all but the kept blocks, so a sparse query past dense_len costs a dense attention over L keys (and
[Hkv, G, n, L] fp32 temporaries: 268 MB per 512-token chunk at 16K on sala-nano). Here each
(KV head, query) gathers its kept blocks' keys and values, at most `keep · block_size` tokens, and runs
the same fp32 softmax over the same allowed keys: equal to the definition up to summation order
(tests/test_attention_gathered.py). Written by hand because no PyTorch op takes a key list per row
on every device (FlexAttention's block masks need torch.compile for speed and are per block row,
not per query).

q [n, Hq, d] at positions q_pos [n]; k, v [L, Hkv, d] as the cache stores them: values, or FP8 with
`kv_scales` = (k_scale [Hkv], v_scale [Hkv]), in which case only the gathered tokens are dequantized
(to q's dtype, as runtime/kv_fp8.dequantize_kv gives every reader); block_mask bool [Hkv, n,
num_blocks] from select_blocks (at most `keep` True per row). Returns o [n, Hq, d] in q's dtype.
"""

from __future__ import annotations

import math

import torch

from salactl.runtime.kv_fp8 import dequantize_kv

# fp32 bytes of gathered keys/values and scores/probabilities alive at once: rows are taken in
# groups that stay under this, so long rows (the 9B keeps 96 blocks of 64 tokens) never build
# temporaries larger than the dense definition's
ROW_GROUP_BYTES = 256 << 20


def _kept_blocks(block_mask, keep):
    """[Hkv, n, keep] ascending block ids: each row's kept blocks, padded where it keeps fewer with
    its lowest-indexed unkept ones (masked out later). The same ids in the same order as the first
    `keep` of a stable sort of the mask, so the sums run in the same order."""
    hkv, n, _ = block_mask.shape
    unkept = ~block_mask
    pad = unkept & (unkept.cumsum(dim=-1) <= keep - block_mask.sum(dim=-1, keepdim=True))
    return (block_mask | pad).nonzero()[:, -1].view(hkv, n, keep)


def _gather_tokens(x, tokens, heads, scale, dtype):
    """x [L, Hkv, d] as stored, tokens [Hkv, m, T] -> fp32 [Hkv, m, T, d] values: whole d-rows
    indexed in the cache's own layout (no copy of the cache; CPU indexing has no float8 kernel,
    so FP8 is taken as its bytes)."""
    if scale is None:
        return x[tokens, heads].float()
    raw = x.view(torch.uint8)[tokens, heads].view(x.dtype)
    return dequantize_kv(raw.movedim(0, -2), scale, dtype).movedim(-2, 0).float()


def selected_attention(q, k, v, q_pos, block_mask, block_size: int, keep: int, kv_scales=None):
    n, hq, d = q.shape
    L, hkv, _ = k.shape
    g = hq // hkv
    keep = min(keep, block_mask.shape[-1])
    if block_mask.shape[-1] and int(block_mask.sum(dim=-1).max()) > keep:
        raise ValueError(f"selected_attention: a row keeps more than keep={keep} blocks")
    blocks = _kept_blocks(block_mask, keep)                                      # [Hkv, n, keep]
    kept = torch.gather(block_mask, -1, blocks)
    tokens = (blocks[..., None] * block_size + torch.arange(block_size, device=q.device)).flatten(-2)
    allowed = kept.repeat_interleave(block_size, dim=-1) & (tokens <= q_pos[None, :, None])
    tokens = tokens.clamp(max=L - 1)                                             # [Hkv, n, T]
    T = tokens.shape[-1]
    k_scale, v_scale = kv_scales if kv_scales is not None else (None, None)
    heads = torch.arange(hkv, device=q.device)[:, None, None]
    # (KV head, row) batch order throughout, the gathered keys' own: matmul copies nothing
    qh = q.float().view(n, hkv, g, d).transpose(0, 1)                            # [Hkv, n, G, d]
    out = torch.empty(hkv, n, g, d, dtype=torch.float32, device=q.device)
    step = max(1, ROW_GROUP_BYTES // (4 * hkv * T * (2 * d + 2 * g)))
    for r0 in range(0, n, step):
        r = slice(r0, min(n, r0 + step))
        kg = _gather_tokens(k, tokens[:, r], heads, k_scale, q.dtype)
        vg = _gather_tokens(v, tokens[:, r], heads, v_scale, q.dtype)
        scores = torch.matmul(qh[:, r], kg.transpose(-1, -2)).div_(math.sqrt(d))  # [Hkv, m, G, T]
        scores.masked_fill_(~allowed[:, r, None], float("-inf"))
        out[:, r] = torch.matmul(torch.softmax(scores, dim=-1), vg)
    return out.transpose(0, 1).reshape(n, hq, d).to(q.dtype)

"""InfLLM-V2 block selection, exactly as DESIGN.md §2 defines it (plain PyTorch, vectorized).

Shapes: q [n, Hq, d] (queries at absolute positions q_pos [n]); k1 [W, Hkv, d] compressed keys.
Result of `select_blocks`: bool [Hkv, n, num_blocks], True where the block is kept.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from salactl.runtime.config import SparseConfig


def num_windows(length: int, sc: SparseConfig) -> int:
    """Full compression windows inside `length` keys: K1_j covers keys [j·st, j·st+ks)."""
    return 0 if length < sc.kernel_size else (length - sc.kernel_size) // sc.kernel_stride + 1


def compress_keys(k: torch.Tensor, sc: SparseConfig, first: int, last: int) -> torch.Tensor:
    """K1_j = mean(K[j·st : j·st+ks]) for j in [first, last); mean in fp32, stored in k's dtype."""
    if last <= first:
        return k.new_zeros(0, *k.shape[1:])
    st, ks = sc.kernel_stride, sc.kernel_size
    span = k[first * st:(last - 1) * st + ks].float()                 # [(last-first-1)·st+ks, H, d]
    return span.unfold(0, ks, st).mean(dim=-1).to(k.dtype)            # [last-first, H, d]


def window_scores(q, k1, q_pos, sc: SparseConfig) -> torch.Tensor:
    """s[h, n, j] = Σ over KV head h's query heads of softmax_j(q·K1_j/√d) over visible windows;
    -inf where window j is not visible to the query (j·st+ks-1 > t). In fp32 (fp64 for fp64
    inputs). Scores equal in exact arithmetic (a repeated phrase repeats its compressed keys) can
    differ by rounding, and the rounding then orders them in the top-k: which of such tied blocks
    is kept may depend on the chunk size or a kernel's summation order."""
    n, hq, d = q.shape
    nwin, hkv, _ = k1.shape
    acc = torch.promote_types(q.dtype, torch.float32)
    qg = q.to(acc).view(n, hkv, hq // hkv, d)
    # in place, as in ops/attention/reference.py: the same values without fresh [Hkv, G, n, W] temporaries
    logits = torch.einsum("nhgd,jhd->hgnj", qg, k1.to(acc)).div_(math.sqrt(d))
    last_key = torch.arange(nwin, device=q.device) * sc.kernel_stride + sc.kernel_size - 1
    visible = last_key[None, :] <= q_pos[:, None]                      # [n, W]
    logits.masked_fill_(~visible, float("-inf"))
    probs = torch.softmax(logits, dim=-1).nan_to_num_(0.0)             # rows with nothing visible -> 0
    return probs.sum(dim=1).masked_fill_(~visible, float("-inf"))      # [Hkv, n, W]


def block_scores(s: torch.Tensor, q_pos, sc: SparseConfig, num_blocks: int) -> torch.Tensor:
    """Max-pool window scores to blocks, then apply the candidate / forced rules.
    +inf: forced (init or local); -inf: not a candidate (after the query's block);
    -1: candidate without a visible window (real scores are >= 0)."""
    hkv, n, nwin = s.shape
    B, st, ks = sc.block_size, sc.kernel_stride, sc.kernel_size
    per_block, left = B // st, ks // st - 1
    kernel = per_block + left                                          # windows overlapping a block
    width = (num_blocks - 1) * per_block + kernel
    padded = torch.full((hkv * n, 1, max(width, left + nwin)), float("-inf"), device=s.device, dtype=s.dtype)
    padded[:, 0, left:left + nwin] = s.reshape(hkv * n, nwin)
    pooled = F.max_pool1d(padded[:, :, :width], kernel, stride=per_block).view(hkv, n, num_blocks)
    b = torch.arange(num_blocks, device=s.device)
    own = (q_pos // B)[:, None]                                        # [n, 1]
    candidate = b[None, :] <= own
    forced = (b[None, :] < sc.init_blocks) | ((b[None, :] >= own - sc.window_blocks) & candidate)
    scores = torch.where(pooled == float("-inf"), torch.full_like(pooled, -1.0), pooled)
    scores = scores.masked_fill(forced, float("inf")).masked_fill(~candidate, float("-inf"))
    return scores


def select_blocks(q, k1, q_pos, sc: SparseConfig, num_blocks: int) -> torch.Tensor:
    """Keep the `topk + window/block` best candidate blocks (forced first; ties -> lower index)."""
    scores = block_scores(window_scores(q, k1, q_pos, sc), q_pos, sc, num_blocks)
    return top_blocks(scores, min(sc.selected_blocks, num_blocks))


def top_blocks(scores: torch.Tensor, keep: int) -> torch.Tensor:
    """The first `keep` blocks of a stable descending sort of `scores` along the last dim, less the
    -inf ones. Without sorting every block: the keep-th largest score splits them into those above
    it (all kept) and those equal to it, of which the lowest-indexed fill the slots left. A NaN ranks
    above +inf and takes a slot without being kept, as in the sort (select_blocks passes none:
    window_scores scores a NaN softmax row 0)."""
    keep = min(keep, scores.shape[-1])
    if keep <= 0:
        return torch.zeros_like(scores, dtype=torch.bool)
    kth = torch.topk(scores, keep, dim=-1).values[..., -1:]
    above = (scores > kth) | scores.isnan()
    tied = scores == kth
    slots_left = keep - above.sum(dim=-1, keepdim=True)
    kept = above | (tied & (tied.cumsum(dim=-1) <= slots_left))
    return kept & (scores > float("-inf"))


def sparse_token_mask(block_mask: torch.Tensor, q_pos, kv_len: int, block_size: int) -> torch.Tensor:
    """Expand a block mask [Hkv, n, nb] to a causal token mask [Hkv, n, kv_len]."""
    tok = block_mask.repeat_interleave(block_size, dim=-1)[..., :kv_len]
    causal = torch.arange(kv_len, device=q_pos.device)[None, :] <= q_pos[:, None]
    return tok & causal[None]

"""Softmax attention over a sequence's cached keys (GQA), plain PyTorch, computed in fp32.

q [n, Hq, d] at positions q_pos [n]; k, v [L, Hkv, d] (all cached keys incl. the new ones);
allowed: optional bool [Hkv, n, L] (None = causal). Returns o [n, Hq, d] in q's dtype.
"""

from __future__ import annotations

import math

import torch


def attention(q, k, v, q_pos, allowed=None):
    n, hq, d = q.shape
    L, hkv, _ = k.shape
    g = hq // hkv
    if allowed is None:
        allowed = (torch.arange(L, device=q.device)[None, :] <= q_pos[:, None])[None].expand(hkv, n, L)
    qg = q.float().view(n, hkv, g, d)
    # in place: the same values, without fresh [Hkv, G, n, L] temporaries (page faults at long L)
    scores = torch.einsum("nhgd,lhd->hgnl", qg, k.float()).div_(math.sqrt(d))
    scores.masked_fill_(~allowed[:, None], float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    o = torch.einsum("hgnl,lhd->nhgd", probs, v.float())
    return o.reshape(n, hq, d).to(q.dtype)

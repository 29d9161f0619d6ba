"""Simple GLA (gated linear attention with a per-head constant decay), plain PyTorch, fp32.

Recurrence (fla semantics): S_t = exp(g_h)·S_{t-1} + k_tᵀ v_t ;  o_t = (scale·q_t) S_t.
Shapes: q, k [T, H, K]; v [T, H, V]; g_gamma [H] (log decay, <= 0); state [H, K, V] fp32.
"""

from __future__ import annotations

import torch


def gla_recurrent(q, k, v, g_gamma, scale, state):
    """Token-by-token recurrence; the definition. Returns (o [T,H,V] fp32, final state)."""
    q, k, v = q.float(), k.float(), v.float()
    s = state.float().clone()
    decay = g_gamma.float().exp()[:, None, None]
    out = []
    for t in range(q.shape[0]):
        s = decay * s + k[t, :, :, None] * v[t, :, None, :]
        out.append(torch.einsum("hk,hkv->hv", q[t] * scale, s))
    return torch.stack(out) if out else q.new_zeros(0, *v.shape[1:]), s


def gla_chunked(q, k, v, g_gamma, scale, state, chunk: int = 64):
    """Exact chunked form of the recurrence (all decay exponents are <= 0, so nothing overflows).

    Inside a chunk of C tokens, with i, j the in-chunk positions:
      o_i  = exp(g(i+1))·(scale q_i) S_prev + Σ_{j<=i} exp(g(i-j)) (scale q_i·k_j) v_j
      S'   = exp(gC) S_prev + Σ_j exp(g(C-1-j)) k_jᵀ v_j
    """
    q, k, v = q.float(), k.float(), v.float()
    g = g_gamma.float()
    s = state.float()
    T = q.shape[0]
    outs = []
    for c0 in range(0, T, chunk):
        qc, kc, vc = q[c0:c0 + chunk] * scale, k[c0:c0 + chunk], v[c0:c0 + chunk]
        C = qc.shape[0]
        idx = torch.arange(C, device=q.device, dtype=torch.float32)
        diff = idx[:, None] - idx[None, :]                                   # [C, C] i - j
        causal = diff >= 0
        decay = torch.exp(g[:, None, None] * diff.clamp(min=0)) * causal       # [H, C, C]
        o_inter = torch.einsum("chk,hkv->chv", qc, s) * torch.exp(g[None, :, None] * (idx[:, None, None] + 1))
        att = torch.einsum("ihk,jhk->hij", qc, kc) * decay
        o_intra = torch.einsum("hij,jhv->ihv", att, vc)
        outs.append(o_inter + o_intra)
        k_decay = torch.exp(g[None, :] * (C - 1 - idx)[:, None])            # [C, H]
        s = torch.exp(g * C)[:, None, None] * s + torch.einsum("chk,chv->hkv", kc * k_decay[..., None], vc)
    o = torch.cat(outs) if outs else q.new_zeros(0, *v.shape[1:])
    return o, s

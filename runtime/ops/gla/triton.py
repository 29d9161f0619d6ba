"""Lightning (Simple GLA) kernels for the GPU engine.

- `gla_decode_`: our own Triton decode step. It updates the fp32 state IN PLACE in a state pool
  [slots, H, K, V] indexed by per-row slot ids (no per-step allocation, fixed num_warps, no
  autotune), so a CUDA graph can capture it; fla's fused_recurrent allocates a fresh state per
  call and is autotuned, which is why this one is hand-written (after vLLM's in-place variant).
- `gla_prefill_`: fla-core `chunk_simple_gla` (imported lazily: the `gpu` extra) over bounded
  chunks, so a long prompt never materialises more than `max_chunk/64` per-chunk states; the
  final fp32 state is written back into the pool. Without fla (CPU, or a CUDA install without the
  `gpu` extra) it runs the exact reference `gla_chunked`; `prefill_impl` says which, so callers
  can warn and records can say so.
Semantics: S_t = exp(g_h)·S_{t-1} + k_tᵀv_t ; o_t = (scale·q_t)·S_t (ops/gla/reference.py).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from salactl.runtime.ops.pdl import launch_args, pdl_wait


@triton.jit
def _gla_decode_kernel(q_ptr, k_ptr, v_ptr, o_ptr, state_ptr, slot_ptr, g_ptr,
                       s_qn, s_qh, s_kn, s_kh, s_vn, s_vh, s_on, s_oh, s_ss, s_sh,
                       scale, K: tl.constexpr, V: tl.constexpr, BV: tl.constexpr, PDL: tl.constexpr = False):
    pdl_wait(PDL)
    n = tl.program_id(0)
    h = tl.program_id(1)
    iv = tl.program_id(2)
    slot = tl.load(slot_ptr + n).to(tl.int64)
    offk = tl.arange(0, K)
    offv = iv * BV + tl.arange(0, BV)
    q = tl.load(q_ptr + n * s_qn + h * s_qh + offk).to(tl.float32) * scale
    k = tl.load(k_ptr + n * s_kn + h * s_kh + offk).to(tl.float32)
    v = tl.load(v_ptr + n * s_vn + h * s_vh + offv).to(tl.float32)
    decay = tl.exp(tl.load(g_ptr + h).to(tl.float32))
    sp = state_ptr + slot * s_ss + h * s_sh + offk[:, None] * V + offv[None, :]
    s = tl.load(sp)
    s = decay * s + k[:, None] * v[None, :]
    tl.store(sp, s)
    o = tl.sum(q[:, None] * s, axis=0)
    tl.store(o_ptr + n * s_on + h * s_oh + offv, o.to(o_ptr.dtype.element_ty))


def gla_decode_(q, k, v, g_gamma, scale, state_pool, slots, out_dtype=None):
    """One token per row. q, k [n, H, K]; v [n, H, V] (any row/head strides, unit last stride; K, V
    powers of two); state_pool [slots, H, K, V] fp32 (contiguous), updated in place at `slots` [n]
    (unit stride)."""
    n, H, K = q.shape
    V = v.shape[-1]
    assert state_pool.dtype == torch.float32 and state_pool.is_contiguous()
    assert q.stride(-1) == 1 and k.stride(-1) == 1 and v.stride(-1) == 1
    assert slots.is_contiguous(), f"slots needs unit stride, got strides {slots.stride()}"
    BV = min(V, 32)
    assert K & (K - 1) == 0 and V & (V - 1) == 0 and V % BV == 0, \
        f"the GLA decode kernel needs power-of-two head dims, got K={K}, V={V}"
    o = torch.empty(n, H, V, device=q.device, dtype=out_dtype or q.dtype)
    _gla_decode_kernel[(n, H, V // BV)](
        q, k, v, o, state_pool, slots, g_gamma,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        o.stride(0), o.stride(1), state_pool.stride(0), state_pool.stride(1),
        float(scale), K=K, V=V, BV=BV, num_warps=4, **launch_args(q.device))
    return o


def _fla_chunk():
    try:
        from fla.ops.simple_gla import chunk_simple_gla
    except ImportError:
        return None
    return chunk_simple_gla


FLA = "fla-core"
REFERENCE = "reference"


def prefill_impl(device) -> str:
    """Which implementation `gla_prefill_` runs on `device`: FLA (CUDA with fla-core importable)
    or REFERENCE (the exact PyTorch `gla_chunked`: CPU, or CUDA without the `gpu` extra, where it
    is correct but far slower)."""
    return FLA if torch.device(device).type == "cuda" and _fla_chunk() is not None else REFERENCE


def gla_prefill_(q, k, v, g_gamma, scale, state_pool, slot: int, max_chunk: int = 32768):
    """Many tokens of ONE sequence: q, k [T, H, K]; v [T, H, V]. Starts from state_pool[slot]
    and writes the final fp32 state back there. Returns o [T, H, V] in q's dtype."""
    T = q.shape[0]
    chunk_fn = _fla_chunk() if prefill_impl(q.device) == FLA else None
    outs = []
    for c0 in range(0, T, max_chunk):
        qc, kc, vc = q[c0:c0 + max_chunk], k[c0:c0 + max_chunk], v[c0:c0 + max_chunk]
        if chunk_fn is not None:
            o, s = chunk_fn(qc.unsqueeze(0), kc.unsqueeze(0), vc.unsqueeze(0), g_gamma=g_gamma.float(),
                            scale=float(scale), initial_state=state_pool[slot:slot + 1],
                            output_final_state=True)
            o, s = o[0], s[0]
        else:
            from salactl.runtime.ops.gla.reference import gla_chunked

            o, s = gla_chunked(qc, kc, vc, g_gamma, scale, state_pool[slot])
        state_pool[slot].copy_(s)
        outs.append(o.to(q.dtype))
    return outs[0] if len(outs) == 1 else torch.cat(outs)

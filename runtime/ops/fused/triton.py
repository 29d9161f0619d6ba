"""Fused small ops of the decode path in Triton: each replaces 4-12 PyTorch kernel launches
(RMSNorm alone is six) by one, which is most of what a CUDA-graph decode step spends outside
the weight-streaming GEMMs. Each kernel reproduces the reference op sequence in reference.py,
including every rounding to the activation dtype. Rows may be strided views (e.g. slices of a
fused qkv projection); the last dimension must be contiguous."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from salactl.runtime.ops.pdl import launch_args, pdl_wait


def _check_unit_last_stride(op: str, **tensors) -> None:
    for name, t in tensors.items():
        assert t.stride(-1) == 1 or t.shape[-1] == 1, \
            f"{op}: {name} needs a contiguous last dimension, got strides {t.stride()}"


@triton.jit
def _rms(x, w, eps, N: tl.constexpr, DT: tl.constexpr):
    """x fp32 (zero-padded), w fp32 -> rms_norm(x) * w rounded like the reference."""
    r = tl.rsqrt(tl.sum(x * x, 0) / N + eps)
    return ((x * r).to(DT).to(tl.float32) * w).to(DT)


@triton.jit
def _add_rmsnorm_kernel(h_ptr, d_ptr, w_ptr, hout_ptr, y_ptr, s_h, s_d, scale, eps,
                        N: tl.constexpr, BLOCK: tl.constexpr, HAS_DELTA: tl.constexpr, PDL: tl.constexpr = False):
    pdl_wait(PDL)
    row = tl.program_id(0).to(tl.int64)
    i = tl.arange(0, BLOCK)
    msk = i < N
    DT = y_ptr.dtype.element_ty
    h = tl.load(h_ptr + row * s_h + i, mask=msk, other=0.0)
    if HAS_DELTA:
        dl = tl.load(d_ptr + row * s_d + i, mask=msk, other=0.0).to(tl.float32)
        h = (h.to(tl.float32) + (dl * scale).to(DT).to(tl.float32)).to(DT)
        tl.store(hout_ptr + row * N + i, h, mask=msk)
    w = tl.load(w_ptr + i, mask=msk, other=0.0).to(tl.float32)
    tl.store(y_ptr + row * N + i, _rms(h.to(tl.float32), w, eps, N, DT), mask=msk)


def add_rmsnorm(h, delta, scale: float, weight, eps: float):
    n, N = h.shape
    _check_unit_last_stride("add_rmsnorm", h=h, weight=weight, **({} if delta is None else {"delta": delta}))
    BLOCK = triton.next_power_of_2(N)
    y = torch.empty(n, N, device=h.device, dtype=h.dtype)
    hout = torch.empty_like(y) if delta is not None else h
    _add_rmsnorm_kernel[(n,)](h, delta if delta is not None else h, weight, hout, y, h.stride(0),
                              delta.stride(0) if delta is not None else 0, float(scale), float(eps),
                              N=N, BLOCK=BLOCK, HAS_DELTA=delta is not None, **launch_args(h.device),
                              num_warps=8 if BLOCK >= 2048 else 4)
    return hout, y


@triton.jit
def _qk_norm_rope_kernel(q_ptr, k_ptr, wq_ptr, wk_ptr, cos_ptr, sin_ptr, qo_ptr, ko_ptr,
                         s_qn, s_qh, s_kn, s_kh, s_cn, H, eps, D: tl.constexpr, PDL: tl.constexpr = False):
    pdl_wait(PDL)
    n = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1)
    which = tl.program_id(2)
    d = tl.arange(0, D)
    HALF: tl.constexpr = D // 2
    rd = (d + HALF) % D
    if which == 0:
        src = q_ptr + n * s_qn + h * s_qh
        w_ptr = wq_ptr
        dst = qo_ptr
    else:
        src = k_ptr + n * s_kn + h * s_kh
        w_ptr = wk_ptr
        dst = ko_ptr
    DT = qo_ptr.dtype.element_ty
    x = tl.load(src + d).to(tl.float32)
    xr = tl.load(src + rd).to(tl.float32)
    r = tl.rsqrt(tl.sum(x * x, 0) / D + eps)
    y = ((x * r).to(DT).to(tl.float32) * tl.load(w_ptr + d).to(tl.float32)).to(DT).to(tl.float32)
    yr = ((xr * r).to(DT).to(tl.float32) * tl.load(w_ptr + rd).to(tl.float32)).to(DT).to(tl.float32)
    yr = tl.where(d < HALF, -yr, yr)
    c = tl.load(cos_ptr + n * s_cn + d)
    s = tl.load(sin_ptr + n * s_cn + d)
    tl.store(dst + (n * H + h) * D + d, (y * c + yr * s).to(DT))


def qk_norm_rope(q, k, wq, wk, cos, sin, eps: float):
    n, H, D = q.shape
    _check_unit_last_stride("qk_norm_rope", q=q, k=k, wq=wq, wk=wk, cos=cos, sin=sin)
    assert sin.stride(0) == cos.stride(0), "qk_norm_rope: cos and sin need the same row stride"
    qo = torch.empty(n, H, D, device=q.device, dtype=q.dtype)
    ko = torch.empty_like(qo)
    _qk_norm_rope_kernel[(n, H, 2)](q, k, wq, wk, cos, sin, qo, ko, q.stride(0), q.stride(1),
                                    k.stride(0), k.stride(1), cos.stride(0), H, float(eps), D=D,
                                    **launch_args(q.device),
                                    num_warps=1)
    return qo, ko


@triton.jit
def _rmsnorm_gate_kernel(o_ptr, w_ptr, z_ptr, y_ptr, s_o, s_z, eps, N: tl.constexpr,
                         BLOCK: tl.constexpr, PDL: tl.constexpr = False):
    pdl_wait(PDL)
    row = tl.program_id(0).to(tl.int64)
    i = tl.arange(0, BLOCK)
    msk = i < N
    DT = y_ptr.dtype.element_ty
    o = tl.load(o_ptr + row * s_o + i, mask=msk, other=0.0).to(DT).to(tl.float32)
    w = tl.load(w_ptr + i, mask=msk, other=0.0).to(tl.float32)
    y = _rms(o, w, eps, N, DT).to(tl.float32)
    z = tl.load(z_ptr + row * s_z + i, mask=msk, other=0.0).to(tl.float32)
    g = tl.sigmoid(z).to(DT).to(tl.float32)
    tl.store(y_ptr + row * N + i, (y * g).to(DT), mask=msk)


def rmsnorm_gate(o, weight, z, eps: float, dtype=None):
    n, N = o.shape
    _check_unit_last_stride("rmsnorm_gate", o=o, weight=weight, z=z)
    BLOCK = triton.next_power_of_2(N)
    y = torch.empty(n, N, device=o.device, dtype=dtype or z.dtype)
    _rmsnorm_gate_kernel[(n,)](o, weight, z, y, o.stride(0), z.stride(0), float(eps), N=N,
                               BLOCK=BLOCK, num_warps=8 if BLOCK >= 2048 else 4, **launch_args(o.device))
    return y


@triton.jit
def _sigmoid_gate_kernel(o_ptr, g_ptr, y_ptr, s_o, s_g, N, BLOCK: tl.constexpr, PDL: tl.constexpr = False):
    pdl_wait(PDL)
    row = tl.program_id(0).to(tl.int64)
    i = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    msk = i < N
    DT = y_ptr.dtype.element_ty
    o = tl.load(o_ptr + row * s_o + i, mask=msk, other=0.0).to(tl.float32)
    g = tl.sigmoid(tl.load(g_ptr + row * s_g + i, mask=msk, other=0.0).to(tl.float32)).to(DT)
    tl.store(y_ptr + row * N + i, (o * g.to(tl.float32)).to(DT), mask=msk)


def sigmoid_gate(o, g):
    n, N = o.shape
    _check_unit_last_stride("sigmoid_gate", o=o, g=g)
    y = torch.empty(n, N, device=o.device, dtype=o.dtype)
    BLOCK = 1024
    _sigmoid_gate_kernel[(n, triton.cdiv(N, BLOCK))](o, g, y, o.stride(0), g.stride(0), N,
                                                      BLOCK=BLOCK, num_warps=4, **launch_args(o.device))
    return y


@triton.jit
def _silu_mul_kernel(gu_ptr, y_ptr, s_gu, N, BLOCK: tl.constexpr, PDL: tl.constexpr = False):
    pdl_wait(PDL)
    row = tl.program_id(0).to(tl.int64)
    i = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    msk = i < N
    DT = y_ptr.dtype.element_ty
    g = tl.load(gu_ptr + row * s_gu + i, mask=msk, other=0.0).to(tl.float32)
    u = tl.load(gu_ptr + row * s_gu + N + i, mask=msk, other=0.0).to(tl.float32)
    a = (g * tl.sigmoid(g)).to(DT).to(tl.float32)
    tl.store(y_ptr + row * N + i, (a * u).to(DT), mask=msk)


def silu_mul(gate_up):
    n, N2 = gate_up.shape
    _check_unit_last_stride("silu_mul", gate_up=gate_up)
    assert N2 % 2 == 0, f"silu_mul: gate_up needs an even width [gate | up], got {N2}"
    N = N2 // 2
    y = torch.empty(n, N, device=gate_up.device, dtype=gate_up.dtype)
    BLOCK = 1024
    _silu_mul_kernel[(n, triton.cdiv(N, BLOCK))](gate_up, y, gate_up.stride(0), N, BLOCK=BLOCK,
                                                 num_warps=4, **launch_args(gate_up.device))
    return y

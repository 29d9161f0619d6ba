"""Our W4A16 Triton kernels: y = x · dequant(W)ᵀ with symmetric 4-bit GPTQ weights.

Why hand-written: on an H200, torch's `_weight_int4pack_mm` was 1.74x faster than bf16 at batch 1
but slower from batch 8, and gemlite 1.3-1.55x at batch 1 and slower from batch 8 (issue 5).

`w4a16_linear` (bottom) is the runtime's dispatch over the tensor-core register layout
(layout.py `pack_tc`, kernels in triton_tc.py). The kernels below work on the older interleaved
layout and stay for comparison in benchmarks/w4a16_bench.py (`--old`):

- `w4a16_mm`: the tensor-core kernel for a few to a few hundred rows (triton_gemv.py has the
  CUDA-core GEMV used for a single row). Each program owns a [BLOCK_M, BLOCK_N] output tile
  and a range of 128-row K blocks (split-K with fp32 atomics when few tiles exist, so small-M
  GEMV launches fill the GPU). The packed weights (layout.py: 16 word rows per 128-row block)
  are read once per tile; nibble j of the word tile is the k=16 slab k0+16j..k0+16j+15.
- Dequantization without int->float conversions: (nibble | 0x4300) reinterpreted as bf16 is
  exactly 128 + q (0x6400 -> 1024 + q for fp16). Since W = s·(q − 8),
  x·W = s·(x·(128+q) − 136·Σx): one dot on the biased values per group, then one fused
  correction and scale per output element and group, in fp32.
- `w4a16_dequantize`: the whole bf16 weight in one pass, for large-M (prefill) calls that are
  better served by cuBLAS on the dequantized tile than by a custom GEMM (chosen by measurement,
  see BENCHMARKS.md).
Import lazily: CPU-only installs have no triton. Under TRITON_INTERPRET=1 (CPU tests), bf16 dots
run as fp32 dots because triton 3.9's interpreter mis-multiplies bf16 (verified by hand).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from salactl.runtime.ops.w4a16.layout import K_BLOCK

_INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"


@triton.jit
def _w4a16_mm_kernel(x_ptr, qw_ptr, s_ptr, y_ptr, M, N, K, stride_xm, stride_ym, split_k,
                     GROUP: tl.constexpr, G_EFF: tl.constexpr, JPG: tl.constexpr,
                     BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, ATOMIC: tl.constexpr,
                     GROUP_M: tl.constexpr, FUSED_DOT: tl.constexpr, MAGIC: tl.constexpr,
                     BIAS: tl.constexpr, DOT_F32: tl.constexpr):
    pid = tl.program_id(0)
    pid_k = tl.program_id(1)
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    in_group = GROUP_M * num_pid_n
    first_m = (pid // in_group) * GROUP_M
    size_m = tl.minimum(num_pid_m - first_m, GROUP_M)
    pid_m = first_m + (pid % in_group) % size_m
    pid_n = (pid % in_group) // size_m

    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    m_mask = offs_m < M
    n_mask = offs_n < N
    r = tl.arange(0, 16)
    ACT = x_ptr.dtype.element_ty

    nkb = K // 128
    per = tl.cdiv(nkb, split_k)
    kb0 = pid_k * per
    kb1 = tl.minimum(kb0 + per, nkb)
    x_rows = x_ptr + offs_m[:, None] * stride_xm
    acc = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    for kb in range(kb0, kb1):
        k0 = kb * 128
        q = tl.load(qw_ptr + (kb * 16 + r)[:, None] * N + offs_n[None, :], mask=n_mask[None, :], other=0)
        if FUSED_DOT:
            # one k=128 dot: expand the word tile to [8, 16, BN] and merge the first two axes
            # (row j*16 + r is k0 + j*16 + r, i.e. natural k order).
            shifts = (tl.arange(0, 8) * 4)[:, None, None]
            nib = ((q[None, :, :] >> shifts) & 0xF) | MAGIC
            wb = nib.to(tl.int16).to(ACT, bitcast=True)
            x = tl.load(x_rows + (k0 + tl.arange(0, 128))[None, :], mask=m_mask[:, None], other=0.0)
            if G_EFF == 128:
                w = tl.reshape(wb, (128, BLOCK_N))
                if DOT_F32:
                    part = tl.dot(x.to(tl.float32), w.to(tl.float32))
                else:
                    part = tl.dot(x, w)
                xs = tl.sum(x.to(tl.float32), axis=1)
                s = tl.load(s_ptr + (k0 // GROUP) * N + offs_n, mask=n_mask, other=0.0).to(tl.float32)
                acc += (part - BIAS * xs[:, None]) * s[None, :]
            else:
                g3 = (k0 + tl.arange(0, 8) * 16) // GROUP
                s3 = tl.load(s_ptr + g3[:, None, None] * N + offs_n[None, None, :],
                             mask=n_mask[None, None, :], other=0.0).to(tl.float32)
                w = tl.reshape(((wb.to(tl.float32) - BIAS) * s3).to(ACT), (128, BLOCK_N))
                if DOT_F32:
                    acc += tl.dot(x.to(tl.float32), w.to(tl.float32))
                else:
                    acc += tl.dot(x, w)
        else:
            for gi in tl.static_range(128 // G_EFF):
                part = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
                xs = tl.zeros((BLOCK_M,), tl.float32)
                for jj in tl.static_range(JPG):
                    j = gi * JPG + jj
                    xj = tl.load(x_rows + (k0 + j * 16 + r)[None, :], mask=m_mask[:, None], other=0.0)
                    w = (((q >> (4 * j)) & 0xF) | MAGIC).to(tl.int16).to(ACT, bitcast=True)
                    if DOT_F32:
                        part += tl.dot(xj.to(tl.float32), w.to(tl.float32))
                    else:
                        part += tl.dot(xj, w)
                    xs += tl.sum(xj.to(tl.float32), axis=1)
                s = tl.load(s_ptr + ((k0 + gi * G_EFF) // GROUP) * N + offs_n, mask=n_mask,
                            other=0.0).to(tl.float32)
                acc += (part - BIAS * xs[:, None]) * s[None, :]

    y_ptrs = y_ptr + offs_m[:, None] * stride_ym + offs_n[None, :]
    mask = m_mask[:, None] & n_mask[None, :]
    if ATOMIC:
        tl.atomic_add(y_ptrs, acc, mask=mask)
    else:
        tl.store(y_ptrs, acc.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _w4a16_dequant_kernel(qw_ptr, s_ptr, w_ptr, N, GROUP: tl.constexpr, BLOCK_N: tl.constexpr,
                          IS_BF16: tl.constexpr):
    """W^T [K, N] in the activation dtype from the interleaved packed tensor."""
    kb = tl.program_id(0)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = offs_n < N
    r = tl.arange(0, 16)
    q = tl.load(qw_ptr + (kb * 16 + r)[:, None] * N + offs_n[None, :], mask=n_mask[None, :], other=0)
    j = tl.arange(0, 8)
    k = kb * 128 + j[:, None, None] * 16 + r[None, :, None]                     # [8, 16, 1]
    nib = (q[None, :, :] >> (j * 4)[:, None, None]) & 0xF
    s = tl.load(s_ptr + (k // GROUP) * N + offs_n[None, None, :], mask=n_mask[None, None, :], other=0.0)
    w = (nib.to(tl.float32) - 8.0) * s.to(tl.float32)
    if IS_BF16:
        w = w.to(tl.bfloat16)
    else:
        w = w.to(tl.float16)
    tl.store(w_ptr + k * N + offs_n[None, None, :], w, mask=n_mask[None, None, :])


@dataclass(frozen=True)
class MMConfig:
    block_m: int
    block_n: int
    split_k: int
    fused_dot: bool = False
    group_m: int = 8
    num_warps: int = 4
    num_stages: int = 3


_SM_COUNT: dict[int, int] = {}


def _sm_count(device: torch.device) -> int:
    if device.type != "cuda":
        return 132
    idx = device.index if device.index is not None else torch.cuda.current_device()
    if idx not in _SM_COUNT:
        _SM_COUNT[idx] = torch.cuda.get_device_properties(idx).multi_processor_count
    return _SM_COUNT[idx]


def default_config(M: int, N: int, K: int, sms: int = 132) -> MMConfig:
    """Tile choice for the tensor-core kernel by batch size (from the H200 sweep in BENCHMARKS.md
    'W4A16 and FP8 KV': BLOCK_N 128 with per-slab dots, split-K to fill the SMs)."""
    if M <= 16:
        bm, warps, stages = 16, 4, 3
    elif M <= 64:
        bm, warps, stages = (32 if M <= 32 else 64), 4, 3
    else:
        return MMConfig(128, 128, 1, True, 8, 8, 3)
    bn = 128 if N >= 1024 else 64
    tiles = -(-M // bm) * -(-N // bn)
    waves = 4 if (2 * tiles < sms and M <= 16) else 2
    split = max(1, min(K // K_BLOCK, -(-waves * sms // tiles)))
    return MMConfig(bm, bn, split, N < 1024, 8, warps, stages)


# (nibble | MAGIC) as the activation dtype is BIAS - 8 + q exactly (see the module docstring).
_MAGIC = {torch.bfloat16: 0x4300, torch.float16: 0x6400}
_BIAS = {torch.bfloat16: 136.0, torch.float16: 1032.0}

# Above this many rows, dequantize once and call cuBLAS (see module docstring).
DEQUANT_MIN_ROWS = 512


def w4a16_mm(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor, group_size: int,
             config: MMConfig | None = None) -> torch.Tensor:
    """x [M, K] (bf16/fp16) · W^T -> [M, N]. qweight int32 [K/8, N] interleaved (layout.py),
    scales [groups, N]; group_size -1 means one group over K."""
    M, K = x.shape
    N = qweight.shape[1]
    assert qweight.shape[0] * 8 == K and K % K_BLOCK == 0, "K must match qweight and be a multiple of 128"
    assert x.dtype in (torch.bfloat16, torch.float16), "activations must be bf16 or fp16"
    group = K if group_size == -1 else group_size
    assert group % 16 == 0 and (group % 128 == 0 or 128 % group == 0), f"unsupported group size {group}"
    if x.stride(-1) != 1:
        x = x.contiguous()
    cfg = config or default_config(M, N, K, _sm_count(x.device))
    g_eff = min(group, 128)
    if cfg.split_k == 1:
        y = torch.empty(M, N, device=x.device, dtype=x.dtype)
    else:
        y = torch.zeros(M, N, device=x.device, dtype=torch.float32)
    grid = (triton.cdiv(M, cfg.block_m) * triton.cdiv(N, cfg.block_n), cfg.split_k)
    _w4a16_mm_kernel[grid](
        x, qweight, scales, y, M, N, K, x.stride(0), y.stride(0), cfg.split_k,
        GROUP=group, G_EFF=g_eff, JPG=g_eff // 16, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n,
        ATOMIC=cfg.split_k > 1, GROUP_M=cfg.group_m, FUSED_DOT=cfg.fused_dot,
        MAGIC=_MAGIC[x.dtype], BIAS=_BIAS[x.dtype], DOT_F32=_INTERPRET,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages)
    return y if cfg.split_k == 1 else y.to(x.dtype)


def w4a16_dequantize(qweight: torch.Tensor, scales: torch.Tensor, group_size: int,
                     dtype: torch.dtype, block_n: int = 128) -> torch.Tensor:
    """The dequantized W^T [K, N] in `dtype`."""
    R, N = qweight.shape
    K = R * 8
    group = K if group_size == -1 else group_size
    w = torch.empty(K, N, device=qweight.device, dtype=dtype)
    grid = (K // K_BLOCK, triton.cdiv(N, block_n))
    _w4a16_dequant_kernel[grid](qweight, scales, w, N, GROUP=group, BLOCK_N=block_n,
                                IS_BF16=dtype == torch.bfloat16, num_warps=4)
    return w


# Rows up to which the CUDA-core GEMV (triton_gemv.py) beats the interleaved tensor-core kernel.
GEMV_MAX_ROWS = 1


def w4a16_linear_interleaved(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor,
                             group_size: int) -> torch.Tensor:
    """The previous dispatch over the interleaved layout (kept for benchmarks/w4a16_bench.py's
    comparison): CUDA-core GEMV for tiny M, `w4a16_mm` up to DEQUANT_MIN_ROWS, dequantize +
    cuBLAS above."""
    M = x.shape[0]
    if M <= GEMV_MAX_ROWS:
        from salactl.runtime.ops.w4a16.triton_gemv import w4a16_gemv

        return w4a16_gemv(x, qweight, scales, group_size, block_n=256, sms=_sm_count(x.device))
    if M >= DEQUANT_MIN_ROWS:
        return x @ w4a16_dequantize(qweight, scales, group_size, x.dtype)
    return w4a16_mm(x, qweight, scales, group_size)


def w4a16_linear(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor,
                 group_size: int) -> torch.Tensor:
    """The runtime's W4A16 linear over the tensor-core layout (layout.py `pack_tc`): the
    register-operand tensor-core kernel (triton_tc.py) below DEQUANT_MIN_ROWS rows, dequantize +
    cuBLAS (`F.linear`, the bf16 path's own GEMM) above."""
    from salactl.runtime.ops.w4a16.triton_tc import w4a16_tc, w4a16_tc_dequantize

    if x.shape[0] >= DEQUANT_MIN_ROWS:
        return torch.nn.functional.linear(x, w4a16_tc_dequantize(qweight, scales, group_size, x.dtype))
    return w4a16_tc(x, qweight, scales, group_size, sms=_sm_count(x.device))

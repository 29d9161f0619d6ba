"""W8A16 skinny GEMM y = x·dequant(W)ᵀ for 8-bit symmetric GPTQ weights at 1-64 rows on the int8
layout, our Triton kernels. On CUDA they run only where the tensor-core layout (triton_tc.py: K % 64,
N % 16, groups of 64k rows) does not fit, e.g. groups of 32 rows (quant/linear.py `choose_layout`).

Hand-written because nothing installed multiplies 16-bit activations by grouped int8 weights on
the GPU without first writing the whole bf16 weight back to memory (torch's `_weight_int8pack_mm`
takes one scale per output channel): dequantizing per call reads 1 byte, writes 2 and reads 2 per
weight, against the 1 byte these kernels read. The weight is quant/linear.py's int8 layout, codes
− 128 as int8 [groups, N, group] with scales [groups, N]: each program owns BN output rows and
walks K (or 1/SPLIT of it) in BK-column steps inside one group, scaling each step's fp32 partial
by its group's scales; splits are summed by the last split of a row tile (runtime/ops/split_k.py).
- one row (`_gemv_kernel`): on CUDA cores, each code made an fp32 by the exponent trick
  (0x4B000000 | byte = 2^23 + byte exactly: one logic op, not a quarter-rate int-to-float convert)
  and one FMA with x, summed along the step;
- 2-64 rows (`_mma_kernel`): the converted codes W[BN, BK]·xᵀ[BK, BM] on tensor cores (int8 values
  are exact in bf16/fp16). Under the Triton interpreter (CPU tests) that product runs in fp32: the
  interpreter's int-to-bf16 conversion is wrong (int8 1 -> 260096 in Triton 3.6).
Floor: N·K bytes + scales; 4096x4096 = 16.8 MB = 4.0 µs at 4.2 TB/s. BENCHMARKS.md has the H200
numbers (benchmarks/w8a16_bench.py).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from salactl.runtime.ops.gemv.skinny import block_m, skinny_tile
from salactl.runtime.ops.pdl import launch_args, pdl_wait
from salactl.runtime.ops.split_k import split_counters, store_split_k

MAX_ROWS = 64
MIN_STEP = 16          # tl.dot's smallest K: a group's step must be at least this


def group_fits(group: int) -> bool:
    """Whether the kernels take the int8 layout with `group` columns per group (its qweight.shape[2]):
    groups of 16k columns, so that every step is a power of two >= MIN_STEP inside one group."""
    return group % MIN_STEP == 0


@dataclass(frozen=True)
class W8Config:
    """One launch: output rows per program, columns per step (at most; never past a group), warps,
    pipeline stages, and the programs per SM that split-K aims for; gemv=1 (the runtime's) runs one
    row on CUDA cores (`_gemv_kernel`); 0, on tensor cores, only for benchmarks/w8a16_bench.py."""
    block_n: int = 64
    block_k: int = 128
    warps: int = 4
    stages: int = 4
    programs_per_sm: int = 4
    gemv: int = 1

    def step(self, group: int) -> int:
        """The largest power of two that divides the group, at most block_k (a power of two):
        min(block_k, group) for power-of-two groups and multiples of block_k, 64 for 192."""
        return min(self.block_k, group & -group)

    def split(self, n: int, k: int, group: int, sms: int) -> int:
        """Split K until about programs_per_sm programs per SM exist, in whole steps."""
        tiles = triton.cdiv(n, self.block_n)
        return max(1, min(triton.cdiv(self.programs_per_sm * sms, tiles), k // self.step(group)))


DEFAULT = W8Config()          # 2-64 rows
DEFAULT_GEMV = W8Config(stages=3, programs_per_sm=8)   # H200: BENCHMARKS.md, W8A16 section


@triton.jit
def _codes(q_ptr, g, k0, rn, rk, nmask, N, GS: tl.constexpr):
    """The int8 codes [BN, BK] of rows rn, columns k0 + rk (inside group g). [groups, N, GS]: row n
    of group g starts at (g·N + n)·GS; GS is a constexpr so that the compiler knows each row's BK
    bytes are 16-byte aligned (vector loads, not byte loads)."""
    return tl.load(q_ptr + (g * N + rn[:, None]).to(tl.int64) * GS + (k0 - g * GS) + rk[None, :],
                   mask=nmask[:, None], other=0)


@triton.jit
def _gemv_kernel(x_ptr, q_ptr, s_ptr, y_ptr, ws_ptr, cnt_ptr, N, K, stride_ym, split_k,
                 GS: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, PDL: tl.constexpr = False):
    pdl_wait(PDL)
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    rn, rm, rk, nmask, mmask = skinny_tile(1, N, 1, BN, BK)
    steps = K // BK
    per = tl.cdiv(steps, split_k)
    acc = tl.zeros((BN,), tl.float32)
    for step in range(pid_k * per, tl.minimum(pid_k * per + per, steps)):
        k0 = step * BK
        g = k0 // GS
        q = _codes(q_ptr, g, k0, rn, rk, nmask, N, GS)
        # the byte (q + 128 as unsigned) under fp32's exponent of 2^23: 2^23 + 128 + q exactly
        w = ((q.to(tl.int32) & 0xFF) ^ 0x4B000080).to(tl.float32, bitcast=True) - 8388736.0
        x = tl.load(x_ptr + k0 + rk).to(tl.float32)
        part = tl.sum(w * x[None, :], 1)
        acc += part * tl.load(s_ptr + g * N + rn, mask=nmask, other=0.0).to(tl.float32)
    store_split_k(acc[:, None], y_ptr, ws_ptr, cnt_ptr, pid_n, pid_k, split_k, rm, rn,
                  nmask[:, None] & mmask[None, :], 1, N, stride_ym, 1)


@triton.jit
def _mma_kernel(x_ptr, q_ptr, s_ptr, y_ptr, ws_ptr, cnt_ptr, M, N, K, stride_xm, stride_ym, split_k,
                GS: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
                F32_DOT: tl.constexpr, PDL: tl.constexpr = False):
    pdl_wait(PDL)
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    rn, rm, rk, nmask, mmask = skinny_tile(M, N, BM, BN, BK)
    steps = K // BK
    per = tl.cdiv(steps, split_k)
    acc = tl.zeros((BN, BM), tl.float32)
    for step in range(pid_k * per, tl.minimum(pid_k * per + per, steps)):
        k0 = step * BK
        g = k0 // GS
        q = _codes(q_ptr, g, k0, rn, rk, nmask, N, GS)
        xt = tl.load(x_ptr + rm[None, :] * stride_xm + (k0 + rk)[:, None], mask=mmask[None, :], other=0.0)
        if F32_DOT:
            part = tl.dot(q.to(tl.float32), xt.to(tl.float32))
        else:
            part = tl.dot(q.to(xt.dtype), xt)
        acc += part * tl.load(s_ptr + g * N + rn, mask=nmask, other=0.0).to(tl.float32)[:, None]
    store_split_k(acc, y_ptr, ws_ptr, cnt_ptr, pid_n, pid_k, split_k, rm, rn, nmask[:, None] & mmask[None, :],
                  M, N, stride_ym, 1)


def w8a16_linear(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor, sms: int = 132,
                 config: W8Config | None = None) -> torch.Tensor:
    """x [M, K] bf16/fp16 (M <= MAX_ROWS, unit last stride) · Wᵀ -> [M, N] in x's dtype; qweight int8
    [groups, N, K/groups] (codes − 128; K/groups a multiple of 16: group_fits), scales [groups, N].
    config: DEFAULT_GEMV at one row, else DEFAULT."""
    M, K = x.shape
    groups, N, gs = qweight.shape
    config = config or (DEFAULT_GEMV if M == 1 else DEFAULT)
    bk = config.step(gs)
    assert groups * gs == K and 1 <= M <= MAX_ROWS and x.stride(1) == 1 and qweight.is_contiguous()
    assert bk >= MIN_STEP, f"groups of {gs} columns: the kernels need groups of 16k (group_fits)"
    assert scales.shape == (groups, N)
    split = config.split(N, K, gs, sms)
    y = torch.empty(M, N, device=x.device, dtype=x.dtype)
    ws = torch.empty(split if split > 1 else 1, M, N, device=x.device, dtype=torch.float32)
    grid = (triton.cdiv(N, config.block_n), split)
    cnt = split_counters(x.device, grid[0])
    launch = dict(GS=gs, BN=config.block_n, BK=bk, num_warps=config.warps, num_stages=config.stages,
                  **launch_args(x.device))
    if M == 1 and config.gemv:
        _gemv_kernel[grid](x, qweight, scales.contiguous(), y, ws, cnt, N, K, y.stride(0), split, **launch)
    else:
        _mma_kernel[grid](x, qweight, scales.contiguous(), y, ws, cnt, M, N, K, x.stride(0), y.stride(0), split,
                          BM=block_m(M), F32_DOT=os.environ.get("TRITON_INTERPRET") == "1", **launch)
    return y

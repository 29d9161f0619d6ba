"""W8A16 skinny GEMM y = x·dequant(W)ᵀ for 8-bit symmetric GPTQ weights at 1-64 rows, our Triton kernel.

Hand-written because nothing installed multiplies 16-bit activations by grouped int8 weights on
the GPU without first writing the whole bf16 weight back to memory (torch's `_weight_int8pack_mm`
takes one scale per output channel): dequantizing per call reads 1 byte, writes 2 and reads 2 per
weight, against the 1 byte this kernel reads. The weight is quant/linear.py's int8 layout, codes − 128
as int8 [groups, N, group] with scales [groups, N]: each program owns BN output rows and walks K
(or 1/SPLIT of it) in BK-column steps inside one group, multiplying the converted codes
W[BN, BK]·xᵀ[BK, BM] on tensor cores (int8 values are exact in bf16/fp16) and scaling each step's
fp32 product by its group's scales. Splits are summed by the last split of a row tile
(runtime/ops/split_k.py). Under the Triton interpreter (CPU tests) the converting variant
(magic=0) multiplies in fp32: its int-to-bf16 conversion is wrong there (int8 1 -> 260096 in
Triton 3.6). Floor: N·K bytes + scales; 4096x4096 = 16.8 MB = 4.0 µs at 4.2 TB/s.
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
# bf16 activations enter the fp16 product times 2^-8 (and the result is scaled back): fp16's
# range then covers |x| up to 2^24, and what falls below its normal range is < 2^-16 in absolute
# terms, far under the bf16 rounding of the activations themselves.
BF16_X_SCALE = 2.0 ** -8


@dataclass(frozen=True)
class W8Config:
    """One launch: output rows per program, columns per step (at most; never past a group), warps,
    pipeline stages, and the programs per SM that split-K aims for."""
    block_n: int = 64
    block_k: int = 128
    warps: int = 4
    stages: int = 4
    programs_per_sm: int = 4
    magic: int = 1          # 1: codes to fp16 by the exponent trick (see the kernel), 0: converted

    def step(self, group: int) -> int:
        return min(self.block_k, group)

    def split(self, n: int, k: int, group: int, sms: int) -> int:
        """Split K until about programs_per_sm programs per SM exist, in whole steps."""
        tiles = triton.cdiv(n, self.block_n)
        return max(1, min(triton.cdiv(self.programs_per_sm * sms, tiles), k // self.step(group)))


DEFAULT = W8Config()


@triton.jit
def _w8a16_kernel(x_ptr, q_ptr, s_ptr, y_ptr, ws_ptr, cnt_ptr, M, N, K, GS, stride_xm, stride_ym, split_k,
                  BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, F32_DOT: tl.constexpr,
                  MAGIC: tl.constexpr, XS: tl.constexpr, PDL: tl.constexpr = False):
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
        # [groups, N, GS]: row n of group g starts at (g·N + n)·GS
        q = tl.load(q_ptr + (g * N + rn[:, None]).to(tl.int64) * GS + (k0 - g * GS) + rk[None, :],
                    mask=nmask[:, None], other=0)
        xt = tl.load(x_ptr + rm[None, :] * stride_xm + (k0 + rk)[:, None], mask=mmask[None, :], other=0.0)
        if MAGIC:
            # the byte under fp16's exponent of 1024: 0x6400 | (q + 128) = 1152 + q exactly, one
            # integer op instead of a quarter-rate int-to-float convert; x enters as fp16 times XS
            w16 = ((q.to(tl.int16) & 0xFF) ^ 0x6480).to(tl.float16, bitcast=True)
            x16 = (xt.to(tl.float32) * XS).to(tl.float16)
            part = tl.dot(w16, x16) - 1152.0 * tl.sum(x16.to(tl.float32), 0)[None, :]
        elif F32_DOT:
            part = tl.dot(q.to(tl.float32), xt.to(tl.float32))
        else:
            part = tl.dot(q.to(xt.dtype), xt)
        scale = tl.load(s_ptr + g * N + rn, mask=nmask, other=0.0).to(tl.float32)
        if MAGIC:
            scale = scale * (1.0 / XS)
        acc += part * scale[:, None]
    store_split_k(acc, y_ptr, ws_ptr, cnt_ptr, pid_n, pid_k, split_k, rm, rn, nmask[:, None] & mmask[None, :],
                  M, N, stride_ym, 1)


def w8a16_linear(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor, sms: int = 132,
                 config: W8Config = DEFAULT) -> torch.Tensor:
    """x [M, K] bf16/fp16 (M <= MAX_ROWS, unit last stride) · Wᵀ -> [M, N] in x's dtype; qweight int8
    [groups, N, K/groups] (codes − 128), scales [groups, N]."""
    M, K = x.shape
    groups, N, gs = qweight.shape
    bk = config.step(gs)
    assert groups * gs == K and 1 <= M <= MAX_ROWS and x.stride(1) == 1 and qweight.is_contiguous()
    assert gs % bk == 0 and scales.shape == (groups, N)
    split = config.split(N, K, gs, sms)
    y = torch.empty(M, N, device=x.device, dtype=x.dtype)
    ws = torch.empty(split if split > 1 else 1, M, N, device=x.device, dtype=torch.float32)
    grid = (triton.cdiv(N, config.block_n), split)
    cnt = split_counters(x.device, grid[0])
    _w8a16_kernel[grid](x, qweight, scales.contiguous(), y, ws, cnt, M, N, K, gs, x.stride(0), y.stride(0), split,
                        BM=block_m(M), BN=config.block_n, BK=bk, F32_DOT=not config.magic and os.environ.get("TRITON_INTERPRET") == "1",
                        MAGIC=bool(config.magic), XS=BF16_X_SCALE if x.dtype == torch.bfloat16 else 1.0,
                        num_warps=config.warps, num_stages=config.stages, **launch_args(x.device))
    return y

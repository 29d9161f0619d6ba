"""W4A16 GEMV for one activation row on CUDA cores, streaming the tensor-core layout (layout.py
`pack_tc`) through Triton's cp.async pipeline (our own Triton; triton.py says why hand-written).

Why a second kernel next to triton_tc.py: at one row the tensor-core kernel loads its words
straight into MMA registers, so only the registers of the current step hold bytes in flight, and
it reaches about half of the copy ceiling on packed bytes. This one loads plain tiles that
Triton's software pipeline (`num_stages`) keeps several iterations ahead in shared memory, the way
the bf16 GEMV (ops/gemv/triton.py) streams its weights.

Layout facts used (layout.py): the 256 words of (k-block kb, 16-row group g) are one contiguous
1 KB chunk, [16 rows x 16 words], word column col = 4c + blk; nibble p of a word (i = p % 4,
pair = p // 4) holds k = 128 kb + 32 blk + 16 (i % 2) + 8 (i // 2) + 2c + pair. A program owns
BR rows and walks KBI k-blocks per step as a [BR, KBI, 16] word tile; the activations it needs
are 8 [KBI, 16] gathers per step, shared by all BR rows.

Dequantization without a subtraction per weight: the nibble is moved to mantissa bits 19-22 under
the exponent of 16.0 (one shift + one LOP3), which is the fp32 value 16 + q exactly; one FFMA
per weight accumulates t = sum (16 + q) x, and per word sum (q - 8) x = t - 24 sum x (sum x over
the word's 8 activations), scaled once per word and group. About 3.3 instructions per weight.
Split-K as in triton_tc.py: fp32 partials, a per-tile ticket, the last split sums in split order.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from salactl.runtime.ops.w4a16.layout import K_BLOCK, TC_ROWS
from salactl.runtime.ops.w4a16.triton_tc import _counters

MAGIC = tl.constexpr(0x41800000)      # 16.0f: mantissa bits 19-22 = q gives 16 + q


@triton.jit
def _load_words(qw_ptr, kb, kb1, row_off, NG, KBI: tl.constexpr):
    """The [BR, KBI, 16] words of k-blocks kb.. (blocks >= kb1 masked: zero, no traffic)."""
    kbs = kb + tl.arange(0, KBI)
    col = tl.arange(0, 16)
    return tl.load(qw_ptr + (kbs[None, :, None] * NG * 256 + row_off[:, None, None] + col[None, None, :]),
                   mask=(kbs < kb1)[None, :, None], other=0)


@triton.jit
def _w4a16_gemv_kernel(x_ptr, qw_ptr, s_ptr, y_ptr, ws_ptr, cnt_ptr, N, K, split_k,
                       GROUP: tl.constexpr, BR: tl.constexpr, KBI: tl.constexpr, PREFETCH: tl.constexpr):
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    NG = N // 16
    nkb = K // 128
    per = tl.cdiv(tl.cdiv(nkb, split_k), KBI) * KBI
    kb0 = pid_k * per
    kb1 = tl.minimum(kb0 + per, nkb)
    n = tl.arange(0, BR)
    kbl = tl.arange(0, KBI)
    col = tl.arange(0, 16)
    rows = pid_n * BR + n
    # word offset of (row n, k-block kb, column col) is kb * NG * 256 + row_off[n] + col
    row_off = (pid_n * (BR // 16) + n // 16) * 256 + (n % 16) * 16
    kcol = 32 * (col % 4) + 2 * (col // 4)                        # k of nibble 0 within the block
    acc = tl.zeros((BR, KBI, 16), tl.float32)
    if PREFETCH:
        w = _load_words(qw_ptr, kb0, kb1, row_off, NG, KBI)
    for kb in range(kb0, kb1, KBI):
        kbs = kb + kbl
        live = kbs < kb1
        if PREFETCH:          # the next step's words are in flight during this step's math
            w_next = _load_words(qw_ptr, kb + KBI, kb1, row_off, NG, KBI)
        else:
            w = _load_words(qw_ptr, kb, kb1, row_off, NG, KBI)
        xk = x_ptr + (kbs[:, None] * 128 + kcol[None, :])[None, :, :]
        xm = live[None, :, None]
        t = tl.zeros((BR, KBI, 16), tl.float32)
        xs = tl.zeros((1, KBI, 16), tl.float32)
        for p in tl.static_range(8):
            xp = tl.load(xk + (16 * (p % 2) + 8 * ((p % 4) // 2) + p // 4), mask=xm, other=0.0).to(tl.float32)
            if 4 * p <= 19:
                bits = ((w << (19 - 4 * p)) & 0x780000) | MAGIC
            else:
                bits = ((w >> (4 * p - 19)) & 0x780000) | MAGIC
            t += bits.to(tl.float32, bitcast=True) * xp
            xs += xp
        if GROUP >= 128:
            g = (kbs * 128) // GROUP
            s = tl.load(s_ptr + g[None, :, None] * N + rows[:, None, None], mask=xm, other=0.0)
        else:
            g = (kbs[:, None] * 128 + 32 * (col % 4)[None, :]) // GROUP
            s = tl.load(s_ptr + g[None, :, :] * N + rows[:, None, None], mask=xm, other=0.0)
        acc += s.to(tl.float32) * (t - 24.0 * xs)
        if PREFETCH:
            w = w_next
    part = tl.sum(tl.sum(acc, 2), 1)
    if split_k == 1:
        tl.store(y_ptr + rows, part.to(y_ptr.dtype.element_ty))
    else:
        tl.store(ws_ptr + pid_k * N + rows, part)
        tl.debug_barrier()
        done = tl.atomic_add(cnt_ptr + pid_n, 1, sem="acq_rel")
        if done == split_k - 1:
            total = tl.zeros((BR,), tl.float32)
            for sk in range(0, split_k):
                total += tl.load(ws_ptr + sk * N + rows, cache_modifier=".cg")
            tl.store(y_ptr + rows, total.to(y_ptr.dtype.element_ty))
            tl.atomic_xchg(cnt_ptr + pid_n, 0)


@dataclass(frozen=True)
class GemvConfig:
    rows: int = 32          # BR: output rows per program (a multiple of 16 dividing N)
    kblocks: int = 8        # KBI: 128-row k-blocks per loop step
    split_k: int = 1
    num_warps: int = 4
    num_stages: int = 1
    prefetch: bool = False  # register double buffer: the next step's words load during this step's math

    @property
    def name(self) -> str:
        pf = " pf" if self.prefetch else ""
        return f"r{self.rows} kb{self.kblocks} s{self.split_k} w{self.num_warps} st{self.num_stages}{pf}"


def supports(N: int, K: int, group_size: int) -> bool:
    g = K if group_size == -1 else group_size
    return N % TC_ROWS == 0 and K % K_BLOCK == 0 and (g % 128 == 0 or g in (32, 64))


def w4a16_gemv(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor, group_size: int,
               config: GemvConfig) -> torch.Tensor:
    """x [1, K] (bf16/fp16) · Wᵀ -> [1, N]; qweight int32 [K/128, N/16, 256] (`pack_tc`), scales
    fp16 [groups, N]; group_size -1 (one group), 32, 64 or a multiple of 128."""
    M, K = x.shape
    N = qweight.shape[1] * TC_ROWS
    assert M == 1 and qweight.shape[0] * K_BLOCK == K and qweight.shape[2] == 256
    group = K if group_size == -1 else group_size
    assert supports(N, K, group_size), f"unsupported W4A16 GEMV shape {N}x{K} / group {group_size}"
    br = config.rows
    while N % br:
        br //= 2
    split = max(1, min(config.split_k, K // K_BLOCK))
    x = x.contiguous()
    y = torch.empty(1, N, device=x.device, dtype=x.dtype)
    ws = torch.empty(split if split > 1 else 1, N, device=x.device, dtype=torch.float32)
    grid = (N // br, split)
    cnt = _counters(x.device, grid[0])
    _w4a16_gemv_kernel[grid](x, qweight, scales, y, ws, cnt, N, K, split, GROUP=group, BR=br,
                             KBI=config.kblocks, PREFETCH=config.prefetch, num_warps=config.num_warps, num_stages=config.num_stages)
    return y

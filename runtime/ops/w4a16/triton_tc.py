"""W4A16 on tensor cores with the weights as the register operand (our own Triton; triton.py says
why hand-written).

y = x·Wᵀ is computed as yᵀ = W·xᵀ: the dequantized weight tile [BLOCK_N, 128] is the MMA's A
operand (register-resident on Hopper's wgmma), the activations xᵀ [128, BLOCK_M] the small B
operand (shared memory), so a batch of 1..BLOCK_M rows costs one MMA per 16x16 weight slab and
fp32 accumulation comes for free. The packed words are stored in the A-fragment order
(layout.py `pack_tc`): each lane's two 16-byte loads land in registers exactly where the MMA
reads them, so the weights never go through shared memory (checked in the sm_90 TTGIR: the only
convert is a register renaming).

Dequantization, 8 weights per word, two per instruction (inline PTX, `DEQUANT_BF16_ASM` /
`DEQUANT_FP16_ASM`): `lop3(q >> 4i, 0x000F000F, 0x43004300)` is the bf16x2 pair (128 + q_i,
128 + q_{i+4}) and one `fma.rn.bf16x2` by (1, -136) gives q - 8 exactly (fp16: magic 0x6400, i.e.
1024 + q, and -1032): 11 instructions per 8 weights. Under
TRITON_INTERPRET=1 (CPU tests) inline asm cannot run, so the same bits are built with plain
Triton ops (`USE_ASM=False`); everything after is shared, so the interpreter test covers the
layout, the reshape/permute chain, scales, split-K and masking, and the GPU test the asm.

Scales: for groups of 128 or more (and per-channel) one fp32 multiply per output element and 128-row
block after the MMA; for groups 16/32/64 the fp16 scale multiplies the weight before the MMA.

Variants (TCConfig; benchmarks/w4a16_bench.py times them all): `bias_dot` drops the fma and adds
an MMA of a constant -(magic + 8) tile instead; `unroll` 2/4 issues the loads of several 128-row
blocks before the first MMA; `prefetch` carries the next step's `unroll` blocks of loads in
registers while this step's are dequantized and multiplied (a register software pipeline: without
it a warp has no loads in flight during its MMAs, and all CTAs of a one-wave grid start in phase,
so DRAM idles during the compute phases); `num_stages` > 1 lets Triton pipeline words and
activations through shared memory (cp.async); `reduce` R > 1 lets the last split load R partials
at once instead of one L2 round trip per split (split 8-32 on the 4096-wide shapes); `early`
prefetches the first blocks' words into L2 before the PDL wait (no kernel writes weights), so
they stream while the previous kernel drains (o_proj M=1 6.05 vs 6.83 us). Offline sm_90
SASS per 128-row block and thread (64 weights at BLOCK_N 64, 4 warps): 163 instructions with the
fma dequant (90 of them dequantization), 160 with the bias MMA, 196 with 3 stages; a CUDA-core
GEMV needs ~5.4 per weight (~345 per 64).

Why the pipeline (diagnosis at 59939ab, offline sm_90 compile): at ~50% of the copy ceiling with
~2.6 SASS instructions per weight the kernel is latency / memory-parallelism bound, not issue bound
(gate/up 16384x4096: 508K weights per SM x 2.6 / 32 lanes / 4 schedulers = ~5 us of issue at 2 GHz
against 8 us of DRAM time). Little's law wants ~4.2 TB/s x ~0.7 µs = ~3 MB in flight, ~22 KB per SM.
The unroll-4 default (128 registers -> 4 CTAs = 16 warps per SM) does put 16 warps x 32 lanes x 4
blocks x 32 B = 64 KB of words in flight, but only at the top of each step: a warp then waits,
dequantizes and multiplies its 4 blocks with nothing outstanding, and since a one-wave grid starts
all CTAs in phase, DRAM idles through the compute phases (4 load/compute rounds per CTA at split
2). `prefetch` keeps the next step's loads outstanding during the MMAs instead (pf=1: 128 registers
at unroll 2, ~3.0 SASS/weight; 128-row tiles with 4 warps, pf=1
unroll 1: 168 registers = 3 CTAs per SM, 2.2 SASS/weight: the per-block address / activation /
barrier work is shared by twice the weights). The 4096-wide shapes also pay a serial split-K
epilogue (one L2 round trip per split in the last CTA; split 8-32): `reduce`.

Split-K in one launch (runtime/ops/split_k.py): the last split of a tile sums the fp32 partials
and writes y in the activation dtype. Import lazily: CPU-only installs have no triton.
"""

from __future__ import annotations

import os
import torch
import triton
import triton.language as tl

from salactl.runtime.ops.pdl import launch_args, pdl_wait
from salactl.runtime.ops.split_k import split_counters, store_split_k
from salactl.runtime.ops.w4a16.layout import K_BLOCK, TC_ROWS
from salactl.runtime.ops.w4a16.tc_config import (TMA_MIN_BLOCK_N, TCConfig, default_tc_config,
                                                 glu_epilogue_ok, launch_split, split_blocks)

_INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"


def _dequant_asm(lop_magic: str, fma_one: str, fma_bias: str) -> tl.constexpr:
    """PTX for one word -> 4 registers of 16-bit pairs (nibble i, nibble i+4), i = 0..3:
    lop3 puts the nibbles under a magic exponent (1.0·2^7 for bf16, 2^10 for fp16, so the value is
    magic + q exactly); with `fma_bias` one fma per pair subtracts magic + 8."""
    lines = ["{", ".reg .b32 t, one, bias;", f"mov.b32 one, {fma_one};", f"mov.b32 bias, {fma_bias};"]
    for i in range(4):
        src = "$4" if i == 0 else "t"
        if i:
            lines.append(f"shr.u32 t, $4, {4 * i};")
        if fma_bias:
            lines.append(f"lop3.b32 t, {src}, 0x000F000F, {lop_magic}, 0xEA;")
            lines.append(f"fma.rn.{'bf16x2' if lop_magic == '0x43004300' else 'f16x2'} ${i}, t, one, bias;")
        else:
            lines.append(f"lop3.b32 ${i}, {src}, 0x000F000F, {lop_magic}, 0xEA;")
    if not fma_bias:
        lines = [ln for ln in lines if "one" not in ln and "bias" not in ln]
        lines.insert(1, ".reg .b32 t;")
    return tl.constexpr("\n".join(lines + ["}"]))


DEQUANT_BF16_ASM = _dequant_asm("0x43004300", "0x3F803F80", "0xC308C308")     # bf16 -136
DEQUANT_FP16_ASM = _dequant_asm("0x64006400", "0x3C003C00", "0xE408E408")     # fp16 -1032
# Without the subtraction (magic + q); the kernel then adds an MMA of a constant -(magic + 8) tile
# with the same activations (exact: fp32 accumulation).
BIASED_BF16_ASM = _dequant_asm("0x43004300", "", "")
BIASED_FP16_ASM = _dequant_asm("0x64006400", "", "")


@triton.jit
def _half_bits(v, OFFSET: tl.constexpr, FP16: tl.constexpr):
    """int32 value in [0, 16) -> the int32 holding the 16 bits of (v + OFFSET) (exact)."""
    if FP16:
        h = (v.to(tl.float32) + OFFSET).to(tl.float16).to(tl.int16, bitcast=True)
    else:
        h = (v.to(tl.float32) + OFFSET).to(tl.bfloat16).to(tl.int16, bitcast=True)
    return h.to(tl.int32) & 0xFFFF


@triton.jit
def _pair(q, I: tl.constexpr, OFFSET: tl.constexpr, FP16: tl.constexpr):
    """Plain-Triton twin of one asm output: 16-bit pair (nibble I + OFFSET, nibble I+4 + OFFSET)."""
    return _half_bits((q >> (4 * I)) & 0xF, OFFSET, FP16) | (_half_bits((q >> (4 * I + 16)) & 0xF, OFFSET, FP16) << 16)


@triton.jit
def _split_halves(r):
    return tl.join(r.to(tl.int16), (r >> 16).to(tl.int16))


@triton.jit
def _load_words(qw_ptr, kb, kb1, pid_n, NG, BLOCK_N: tl.constexpr, WARPS: tl.constexpr, EVEN_N: tl.constexpr):
    """The [BLOCK_N, 16] word tile of 128-row block kb (row n, word w = 4·blk + c).

    Loaded as a 2-D [BLOCK_N·4, 4] tile whose row r = (g_hi, n8, g_lo, nlo, c) (c fastest):
    Triton's default blocked layout for it (4 words per lane, lanes along r, then warps, then
    registers) is then exactly the MMA A-operand layout: lane = (nlo, c), warp = g_lo (16-row
    slab), registers = n8 (rows +8) and g_hi (rows + 16·WARPS). Blocks kb >= kb1 (pipeline tails)
    read block kb1 - 1's address under a false mask: no memory traffic."""
    G_LO: tl.constexpr = WARPS if BLOCK_N // 16 >= WARPS else BLOCK_N // 16
    G_HI: tl.constexpr = BLOCK_N // 16 // G_LO
    r = tl.arange(0, BLOCK_N * 4)
    c = r % 4
    nlo = (r // 4) % 8
    g_lo = (r // 32) % G_LO
    n8 = (r // (32 * G_LO)) % 2
    g_hi = r // (64 * G_LO)
    gg = pid_n * (BLOCK_N // 16) + g_hi * G_LO + g_lo
    row = (tl.minimum(kb, kb1 - 1) * NG + gg) * 256 + n8 * 128 + nlo * 16 + c * 4
    live = (r * 0 + kb) < kb1
    if EVEN_N:
        q2 = tl.load(qw_ptr + row[:, None] + tl.arange(0, 4)[None, :], mask=live[:, None], other=0)
    else:
        q2 = tl.load(qw_ptr + row[:, None] + tl.arange(0, 4)[None, :], mask=(live & (gg < NG))[:, None], other=0)
    q6 = tl.reshape(q2, (G_HI, 2, G_LO, 8, 4, 4))                    # (g_hi, n8, g_lo, nlo, c, blk)
    return tl.reshape(tl.permute(q6, (0, 2, 1, 3, 5, 4)), (BLOCK_N, 16))


@triton.jit
def _dequant6(q, BLOCK_N: tl.constexpr, USE_ASM: tl.constexpr, BIASED: tl.constexpr, FP16: tl.constexpr):
    """Words [BLOCK_N, 16] -> q - 8 (magic + q if BIASED) in the activation dtype, as
    [BLOCK_N, 4 blk, 4 c, 2 tile, 2 half8, 2 pair]."""
    if USE_ASM:
        if FP16:
            ASM: tl.constexpr = BIASED_FP16_ASM if BIASED else DEQUANT_FP16_ASM
        else:
            ASM: tl.constexpr = BIASED_BF16_ASM if BIASED else DEQUANT_BF16_ASM
        r0, r1, r2, r3 = tl.inline_asm_elementwise(
            ASM, "=r,=r,=r,=r,r", [q], dtype=(tl.int32, tl.int32, tl.int32, tl.int32), is_pure=True, pack=1)
    else:
        OFF: tl.constexpr = (1024.0 if FP16 else 128.0) if BIASED else -8.0
        r0 = _pair(q, 0, OFF, FP16)
        r1 = _pair(q, 1, OFF, FP16)
        r2 = _pair(q, 2, OFF, FP16)
        r3 = _pair(q, 3, OFF, FP16)
    # register i = 2·d1 + d0 holds nibbles (i, i+4) = elements j = 4·d0 + 2·d1 + {0, 1}
    w = _split_halves(tl.join(tl.join(r0, r1), tl.join(r2, r3)))      # [BN, 16, 2 d0, 2 d1, 2]
    w = tl.reshape(w, (BLOCK_N, 16, 8))
    if FP16:
        w = w.to(tl.float16, bitcast=True)
    else:
        w = w.to(tl.bfloat16, bitcast=True)
    return tl.reshape(w, (BLOCK_N, 4, 4, 2, 2, 2))


@triton.jit
def _to_k_order(w6, BLOCK_N: tl.constexpr):
    """[BN, blk, c, tile, half8, pair] -> [BN, 128] with k = 32 blk + 16 tile + 8 half8 + 2c + pair."""
    return tl.reshape(tl.permute(w6, (0, 1, 3, 4, 2, 5)), (BLOCK_N, 128))


@triton.jit
def _group_scales6(s_ptr, kb, kb1, offs_n, N, GROUP: tl.constexpr):
    """fp32 scales broadcastable to the 6-D tile, for groups smaller than 128 rows."""
    blk = tl.arange(0, 4)[None, :, None, None, None, None]
    tile = tl.arange(0, 2)[None, None, None, :, None, None]
    grp = (kb * 128 + blk * 32 + tile * 16) // GROUP
    n6 = offs_n[:, None, None, None, None, None]
    return tl.load(s_ptr + grp * N + n6, mask=(n6 < N) & (n6 * 0 + kb < kb1), other=0.0).to(tl.float32)


@triton.jit
def _prefetch_then_wait(qw_ptr, kb0, kb1, pid_n, NG, BLOCK_N: tl.constexpr, BLOCKS: tl.constexpr,
                        PDL: tl.constexpr):
    """The PDL wait, preceded (BLOCKS > 0, PDL on) by an L2 prefetch of the word tiles of blocks
    kb0 .. kb0 + BLOCKS - 1 (< kb1): in the pack_tc layout a tile is BLOCK_N/16 contiguous 1 KB rows,
    one `prefetch.global.L2` per 128-byte line, 128 lines per loop step (bounded registers for any
    BLOCKS). No kernel writes weights (pdl.py), so they may be read before the wait; the loads after
    it then hit L2."""
    if BLOCKS > 0 and PDL:
        LINES: tl.constexpr = BLOCK_N // 16 * 8
        STEP: tl.constexpr = triton.next_power_of_2(max(LINES, min(BLOCKS * LINES, 128)))
        for c in tl.range(0, BLOCKS * LINES, STEP):
            i = c + tl.arange(0, STEP)
            kb = kb0 + i // LINES
            ptrs = qw_ptr + ((tl.minimum(kb, kb1 - 1) * NG + pid_n * (BLOCK_N // 16)) * 256 + (i % LINES) * 32).to(tl.int64)
            live = (i < BLOCKS * LINES) & (kb < kb1)
            tl.inline_asm_elementwise("{ .reg .pred p; setp.ne.b32 p, $2, 0; @p prefetch.global.L2 [$1]; mov.u32 $0, 0; }",
                                      "=r,l,r", [ptrs, live.to(tl.int32)], dtype=tl.int32, is_pure=False, pack=1)
    pdl_wait(PDL)


@triton.jit
def _load_block(x_ptr, qw_ptr, s_ptr, kb, kb1, pid_n, offs_n, offs_m, M, N, NG, stride_xm, GROUP: tl.constexpr,
                BLOCK_N: tl.constexpr, WARPS: tl.constexpr, EVEN_N: tl.constexpr):
    """Words, activations and (for groups >= 128) scales of block kb. For kb >= kb1 (unroll and
    prefetch tails) everything is masked (words 0, x and s zero), so the block adds nothing."""
    q = _load_words(qw_ptr, kb, kb1, pid_n, NG, BLOCK_N, WARPS, EVEN_N)
    xt = tl.load(x_ptr + offs_m[None, :] * stride_xm + (kb * 128 + tl.arange(0, 128))[:, None],
                 mask=(offs_m < M)[None, :] & (kb * 128 + tl.arange(0, 128) < kb1 * 128)[:, None], other=0.0)
    if GROUP < 128:
        s = tl.zeros((BLOCK_N,), tl.float32)
    else:
        s = tl.load(s_ptr + ((kb * 128) // GROUP) * N + offs_n, mask=(offs_n < N) & (offs_n * 0 + kb < kb1),
                    other=0.0).to(tl.float32)
    return q, xt, s


@triton.jit
def _mma_block(acc, neg_bias, q, xt, s, s_ptr, kb, kb1, offs_n, N, GROUP: tl.constexpr, BLOCK_N: tl.constexpr,
               USE_ASM: tl.constexpr, DOT_F32: tl.constexpr, BIAS_DOT: tl.constexpr):
    BIASED: tl.constexpr = BIAS_DOT and GROUP >= 128
    FP16: tl.constexpr = xt.dtype == tl.float16
    w6 = _dequant6(q, BLOCK_N, USE_ASM, BIASED, FP16)
    if GROUP < 128:
        w6 = (w6.to(tl.float32) * _group_scales6(s_ptr, kb, kb1, offs_n, N, GROUP)).to(xt.dtype)
    w = _to_k_order(w6, BLOCK_N)
    if DOT_F32:
        part = tl.dot(w.to(tl.float32), xt.to(tl.float32))
        if BIASED:
            part = tl.dot(neg_bias.to(tl.float32), xt.to(tl.float32), part)
    else:
        part = tl.dot(w, xt)
        if BIASED:
            part = tl.dot(neg_bias, xt, part)
    if GROUP < 128:
        return acc + part
    else:
        return acc + part * s[:, None]


@triton.jit
def _tile_setup(M, N, K, split_k, BLOCK_N: tl.constexpr, BLOCK_M: tl.constexpr, KBP: tl.constexpr):
    """Program (n tile, split, m tile) -> its rows, columns, masks and 128-row blocks [kb0, kb1)
    (whole groups of KBP blocks per split)."""
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    pid_m = tl.program_id(2)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    per = tl.cdiv(tl.cdiv(K // 128, split_k), KBP) * KBP
    kb0 = pid_k * per
    kb1 = tl.minimum(kb0 + per, K // 128)
    return pid_n, pid_k, pid_m, offs_n, offs_m, offs_n < N, offs_m < M, kb0, kb1


@triton.jit
def _w4a16_tc_kernel(x_ptr, qw_ptr, s_ptr, y_ptr, ws_ptr, cnt_ptr, M, N, K, stride_xm, stride_ym,
                     split_k, bias, GROUP: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_M: tl.constexpr,
                     USE_ASM: tl.constexpr, DOT_F32: tl.constexpr, WARPS: tl.constexpr,
                     BIAS_DOT: tl.constexpr, UNROLL: tl.constexpr, PREFETCH: tl.constexpr,
                     EVEN_N: tl.constexpr, RED: tl.constexpr, EARLY: tl.constexpr = 0, PDL: tl.constexpr = False):
    # M and split_k stay specialised (M = 1 and split 1 compile apart): un-specialising them cost
    # 5-25% at M = 1 on the H200 (BENCHMARKS.md, W4A16 session 3)
    pid_n, pid_k, pid_m, offs_n, offs_m, n_mask, m_mask, kb0, kb1 = _tile_setup(M, N, K, split_k, BLOCK_N, BLOCK_M, 1)
    _prefetch_then_wait(qw_ptr, kb0, kb1, pid_n, N // 16, BLOCK_N, EARLY, PDL)   # EARLY: blocks to prefetch
    NG = N // 16
    acc = tl.zeros((BLOCK_N, BLOCK_M), tl.float32)
    # -(magic + 8) from a runtime argument, so the compiler cannot fold it into per-block constants
    neg_bias = tl.full((BLOCK_N, 128), bias, tl.float32).to(x_ptr.dtype.element_ty)
    if PREFETCH == 1:
        # software pipeline over groups of UNROLL blocks: the loads of group g + 1 are issued
        # before the dequantization and MMAs of group g, so every warp always has loads in flight
        q, xt, s = _load_block(x_ptr, qw_ptr, s_ptr, kb0, kb1, pid_n, offs_n, offs_m, M, N, NG, stride_xm,
                               GROUP, BLOCK_N, WARPS, EVEN_N)
        if UNROLL >= 2:
            q2, xt2, s2 = _load_block(x_ptr, qw_ptr, s_ptr, kb0 + 1, kb1, pid_n, offs_n, offs_m, M, N, NG,
                                      stride_xm, GROUP, BLOCK_N, WARPS, EVEN_N)
        if UNROLL == 4:
            q3, xt3, s3 = _load_block(x_ptr, qw_ptr, s_ptr, kb0 + 2, kb1, pid_n, offs_n, offs_m, M, N, NG,
                                      stride_xm, GROUP, BLOCK_N, WARPS, EVEN_N)
            q4, xt4, s4 = _load_block(x_ptr, qw_ptr, s_ptr, kb0 + 3, kb1, pid_n, offs_n, offs_m, M, N, NG,
                                      stride_xm, GROUP, BLOCK_N, WARPS, EVEN_N)
        for kb in range(kb0, kb1, UNROLL):
            qn, xtn, sn = _load_block(x_ptr, qw_ptr, s_ptr, kb + UNROLL, kb1, pid_n, offs_n, offs_m, M, N, NG,
                                      stride_xm, GROUP, BLOCK_N, WARPS, EVEN_N)
            if UNROLL >= 2:
                qn2, xtn2, sn2 = _load_block(x_ptr, qw_ptr, s_ptr, kb + UNROLL + 1, kb1, pid_n, offs_n, offs_m,
                                             M, N, NG, stride_xm, GROUP, BLOCK_N, WARPS, EVEN_N)
            if UNROLL == 4:
                qn3, xtn3, sn3 = _load_block(x_ptr, qw_ptr, s_ptr, kb + UNROLL + 2, kb1, pid_n, offs_n, offs_m,
                                             M, N, NG, stride_xm, GROUP, BLOCK_N, WARPS, EVEN_N)
                qn4, xtn4, sn4 = _load_block(x_ptr, qw_ptr, s_ptr, kb + UNROLL + 3, kb1, pid_n, offs_n, offs_m,
                                             M, N, NG, stride_xm, GROUP, BLOCK_N, WARPS, EVEN_N)
            acc = _mma_block(acc, neg_bias, q, xt, s, s_ptr, kb, kb1, offs_n, N, GROUP, BLOCK_N,
                             USE_ASM, DOT_F32, BIAS_DOT)
            q, xt, s = qn, xtn, sn
            if UNROLL >= 2:
                acc = _mma_block(acc, neg_bias, q2, xt2, s2, s_ptr, kb + 1, kb1, offs_n, N, GROUP, BLOCK_N,
                                 USE_ASM, DOT_F32, BIAS_DOT)
                q2, xt2, s2 = qn2, xtn2, sn2
            if UNROLL == 4:
                acc = _mma_block(acc, neg_bias, q3, xt3, s3, s_ptr, kb + 2, kb1, offs_n, N, GROUP, BLOCK_N,
                                 USE_ASM, DOT_F32, BIAS_DOT)
                acc = _mma_block(acc, neg_bias, q4, xt4, s4, s_ptr, kb + 3, kb1, offs_n, N, GROUP, BLOCK_N,
                                 USE_ASM, DOT_F32, BIAS_DOT)
                q3, xt3, s3 = qn3, xtn3, sn3
                q4, xt4, s4 = qn4, xtn4, sn4
    else:
        for kb in range(kb0, kb1, UNROLL):
            # every load of the UNROLL blocks is issued before the first MMA
            q, xt, s = _load_block(x_ptr, qw_ptr, s_ptr, kb, kb1, pid_n, offs_n, offs_m, M, N, NG, stride_xm,
                                   GROUP, BLOCK_N, WARPS, EVEN_N)
            if UNROLL >= 2:
                q2, xt2, s2 = _load_block(x_ptr, qw_ptr, s_ptr, kb + 1, kb1, pid_n, offs_n, offs_m, M, N, NG,
                                          stride_xm, GROUP, BLOCK_N, WARPS, EVEN_N)
            if UNROLL == 4:
                q3, xt3, s3 = _load_block(x_ptr, qw_ptr, s_ptr, kb + 2, kb1, pid_n, offs_n, offs_m, M, N, NG,
                                          stride_xm, GROUP, BLOCK_N, WARPS, EVEN_N)
                q4, xt4, s4 = _load_block(x_ptr, qw_ptr, s_ptr, kb + 3, kb1, pid_n, offs_n, offs_m, M, N, NG,
                                          stride_xm, GROUP, BLOCK_N, WARPS, EVEN_N)
            acc = _mma_block(acc, neg_bias, q, xt, s, s_ptr, kb, kb1, offs_n, N, GROUP, BLOCK_N,
                             USE_ASM, DOT_F32, BIAS_DOT)
            if UNROLL >= 2:
                acc = _mma_block(acc, neg_bias, q2, xt2, s2, s_ptr, kb + 1, kb1, offs_n, N, GROUP, BLOCK_N,
                                 USE_ASM, DOT_F32, BIAS_DOT)
            if UNROLL == 4:
                acc = _mma_block(acc, neg_bias, q3, xt3, s3, s_ptr, kb + 2, kb1, offs_n, N, GROUP, BLOCK_N,
                                 USE_ASM, DOT_F32, BIAS_DOT)
                acc = _mma_block(acc, neg_bias, q4, xt4, s4, s_ptr, kb + 3, kb1, offs_n, N, GROUP, BLOCK_N,
                                 USE_ASM, DOT_F32, BIAS_DOT)

    store_split_k(acc, y_ptr, ws_ptr, cnt_ptr, pid_m * tl.num_programs(0) + pid_n, pid_k, split_k, offs_m, offs_n,
                  m_mask[None, :] & n_mask[:, None], M, N, stride_ym, RED)


@triton.jit
def _w4a16_tc_dequant_kernel(qw_ptr, s_ptr, w_ptr, N, K, GROUP: tl.constexpr, BLOCK_N: tl.constexpr,
                             USE_ASM: tl.constexpr, WARPS: tl.constexpr):
    """W [N, K] in w's dtype from the tensor-core layout (prefill: cuBLAS on the result)."""
    FP16: tl.constexpr = w_ptr.dtype.element_ty == tl.float16
    kb = tl.program_id(0)
    pid_n = tl.program_id(1)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    q = _load_words(qw_ptr, kb, kb + 1, pid_n, N // 16, BLOCK_N, WARPS, False)
    w6 = _dequant6(q, BLOCK_N, USE_ASM, False, FP16).to(tl.float32)
    if GROUP < 128:
        s6 = _group_scales6(s_ptr, kb, kb + 1, offs_n, N, GROUP)
    else:
        s = tl.load(s_ptr + ((kb * 128) // GROUP) * N + offs_n, mask=offs_n < N, other=0.0)
        s6 = s.to(tl.float32)[:, None, None, None, None, None]
    w = _to_k_order((w6 * s6).to(w_ptr.dtype.element_ty), BLOCK_N)
    k = kb * 128 + tl.arange(0, 128)
    tl.store(w_ptr + offs_n[:, None].to(tl.int64) * K + k[None, :], w, mask=(offs_n < N)[:, None])


_NEG_BIAS = {torch.bfloat16: -136.0, torch.float16: -1032.0}


def _check_scales(scales: torch.Tensor, K: int, N: int, group: int) -> None:
    """The kernels read row k // group of scales [groups, N] and trust its shape."""
    groups = triton.cdiv(K, group)
    assert scales.shape == (groups, N), \
        f"scales {tuple(scales.shape)} for a {N}x{K} weight in groups of {group}: need ({groups}, {N})"


def w4a16_tc(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor, group_size: int,
             config: TCConfig | None = None, use_asm: bool | None = None, sms: int = 132,
             glu: bool = False) -> torch.Tensor:
    """x [M, K] (bf16/fp16) · Wᵀ -> [M, N] in x's dtype. qweight int32 [K/128, N/16, 256] (layout.py
    `pack_tc`), scales fp16 [groups, N]; group_size -1 means one group over K. glu: W is [gate | up]
    (N/2 rows each) and the result is silu(x·gateᵀ)·(x·upᵀ) [M, N/2], stored by the GEMM itself
    (the config must pass tc_config.glu_epilogue_ok)."""
    M, K = x.shape
    N = qweight.shape[1] * TC_ROWS
    assert qweight.shape[0] * K_BLOCK == K and qweight.shape[2] == 256, "qweight must be pack_tc(q) of a [K, N] weight"
    assert x.dtype in _NEG_BIAS, "the W4A16 kernel takes bf16 or fp16 activations"
    group = K if group_size == -1 else group_size
    assert (group % 128 == 0) or group in (16, 32, 64), f"unsupported group size {group}"
    _check_scales(scales, K, N, group)
    if x.stride(-1) != 1:
        x = x.contiguous()
    cfg = config or default_tc_config(M, N, K, sms)
    split = launch_split(cfg, K)
    assert not glu or glu_epilogue_ok(cfg, N, K, group_size), f"no silu·mul epilogue for {cfg} at N = {N}"
    y = torch.empty(M, N // 2 if glu else N, device=x.device, dtype=x.dtype)
    ws = torch.empty(split if split > 1 else 1, M, N, device=x.device, dtype=torch.float32)
    grid = (triton.cdiv(N, cfg.block_n), split, triton.cdiv(M, cfg.block_m))
    cnt = split_counters(x.device, grid[0] * grid[2])
    if cfg.tma:
        assert cfg.block_n >= TMA_MIN_BLOCK_N, f"the TMA variant needs BLOCK_N >= {TMA_MIN_BLOCK_N}"
        from salactl.runtime.ops.w4a16.triton_tma import launch_tma

        launch_tma(x, qweight, scales, y, ws, cnt, grid, split, _NEG_BIAS[x.dtype], group, cfg,
                   (not _INTERPRET) if use_asm is None else use_asm, _INTERPRET, glu)
        return y
    _w4a16_tc_kernel[grid](
        x, qweight, scales, y, ws, cnt, M, N, K, x.stride(0), y.stride(0), split, _NEG_BIAS[x.dtype],
        **tc_kernel_constexprs(cfg, N, K, group, (not _INTERPRET) if use_asm is None else use_asm, _INTERPRET),
        num_warps=cfg.num_warps, num_stages=cfg.num_stages, **launch_args(x.device))
    return y


def tc_kernel_constexprs(cfg: TCConfig, N: int, K: int, group: int, use_asm: bool, dot_f32: bool) -> dict:
    """The compile-time arguments `_w4a16_tc_kernel` is launched with (also what
    tools/sass_loops.py compiles offline)."""
    return dict(GROUP=group, BLOCK_N=cfg.block_n, BLOCK_M=cfg.block_m, USE_ASM=use_asm, DOT_F32=dot_f32,
                WARPS=cfg.num_warps, BIAS_DOT=cfg.bias_dot, UNROLL=cfg.unroll, PREFETCH=int(cfg.prefetch),
                EVEN_N=N % cfg.block_n == 0, RED=cfg.reduce,
                EARLY=cfg.prefetch_blocks(split_blocks(K, launch_split(cfg, K))))


def w4a16_tc_dequantize(qweight: torch.Tensor, scales: torch.Tensor, group_size: int,
                        dtype: torch.dtype = torch.bfloat16, block_n: int = 64) -> torch.Tensor:
    """The dequantized W [N, K] (then `F.linear(x, W)` is the plain cuBLAS call)."""
    K, N = qweight.shape[0] * K_BLOCK, qweight.shape[1] * TC_ROWS
    group = K if group_size == -1 else group_size
    _check_scales(scales, K, N, group)
    w = torch.empty(N, K, device=qweight.device, dtype=dtype)
    grid = (K // K_BLOCK, triton.cdiv(N, block_n))
    _w4a16_tc_dequant_kernel[grid](qweight, scales, w, N, K, GROUP=group, BLOCK_N=block_n,
                                   USE_ASM=not _INTERPRET, WARPS=4, num_warps=4)
    return w

"""W4A16 with split-K across the warps of one program (TCConfig `wk`; our own Triton, the same
weights and math as triton_tc.py, whose docstring says why hand-written).

Why: the register and TMA kernels split K across programs to fill the GPU, and the last split of
each tile then sums the partials through global memory (split_k.py): a store, a ticket and the
partial loads, 1.3-1.9 us of dependent L2 round trips per call at M = 1 (BENCHMARKS.md, W4A16
session 14), which is a third of o_proj's 5.8 us. Here one program owns all of K (or a few splits of
it) for BLOCK_N outputs, and its warps take different 128-row K blocks: the tile is 3-D, [B blocks,
BLOCK_N, 128] weights times [B, 128, BLOCK_M] activations, one batched MMA whose batch axis lies
along the warps, and the B partial products are summed in shared memory at the end (tl.sum over the
batch axis), in a fixed order.

Layout: the words are the `pack_tc` layout, loaded as a 2-D [B·BLOCK_N·4, 4] tile whose row is
(b_hi, g, n8, b_lo, lane), so lanes, then warps (b_lo: the warp's block), then registers fall where
the batched MMA wants them. The dequantized values are ordered along a *virtual* k = (blk, tile, c,
half8, pair), the order of Triton's kWidth=4 MMA operand (each lane's 4 consecutive values), and the
activations are permuted into the same order (`_x_virtual_k`): Σ_k w_k·x_k does not depend on the order of
k, and with the true order Triton shuffled every weight between lanes (offline sm_90: 64 SEL + 32
SHFL per block and warp, gone with the virtual order).

Groups of 128 rows or more (and per-channel scales) only: the scale multiplies each block's MMA
result, as in triton_tc.py. Under TRITON_INTERPRET=1 the interpreter's bf16 3-D dot is wrong, so the
dot runs in fp32 there (DOT_F32), and the dequantization in plain Triton (USE_ASM=False).
Import lazily: CPU-only installs have no triton.
"""

from __future__ import annotations

import triton
import triton.language as tl

from salactl.runtime.ops.pdl import launch_args, pdl_wait
from salactl.runtime.ops.split_k import store_split_k
from salactl.runtime.ops.w4a16.tc_config import launch_split, split_blocks
from salactl.runtime.ops.w4a16.triton_tc import DEQUANT_BF16_ASM, DEQUANT_FP16_ASM, _pair, _split_halves, _tile_setup


@triton.jit
def _wk_words(qw_ptr, kb, kb1, pid_n, NG, B: tl.constexpr, BLOCK_N: tl.constexpr, W: tl.constexpr,
              EVEN_K: tl.constexpr, EVEN_N: tl.constexpr):
    """Words of blocks kb .. kb + B - 1 of the tile's BLOCK_N rows as [B, BLOCK_N, 16] (row n, word
    4·blk + c); block b of a step belongs to warp b % W. Blocks >= kb1 and row groups >= NG are masked
    (EVEN_K, EVEN_N: there are none)."""
    r = tl.arange(0, B * BLOCK_N * 4)
    lane = r % 32                                    # (nlo, c)
    b_lo = (r // 32) % W
    n8 = (r // (32 * W)) % 2
    g = (r // (64 * W)) % (BLOCK_N // 16)
    b_hi = r // (4 * W * BLOCK_N)
    k = kb + b_hi * W + b_lo
    gg = pid_n * (BLOCK_N // 16) + g
    if EVEN_K and EVEN_N:
        q2 = tl.load(qw_ptr + ((k * NG + gg) * 256 + n8 * 128 + lane * 4)[:, None] + tl.arange(0, 4)[None, :])
    else:
        row = (tl.minimum(k, kb1 - 1) * NG + gg) * 256 + n8 * 128 + lane * 4
        live = (k < kb1) & (gg < NG)
        q2 = tl.load(qw_ptr + row[:, None] + tl.arange(0, 4)[None, :], mask=live[:, None], other=0)
    q8 = tl.reshape(q2, (B // W, BLOCK_N // 16, 2, W, 8, 4, 4))          # (b_hi, g, n8, b_lo, nlo, c, blk)
    return tl.reshape(tl.permute(q8, (0, 3, 1, 2, 4, 6, 5)), (B, BLOCK_N, 16))


@triton.jit
def _dequant_virtual_k(q, B: tl.constexpr, BLOCK_N: tl.constexpr, USE_ASM: tl.constexpr, FP16: tl.constexpr):
    """Words [B, BLOCK_N, 16] -> q - 8 [B, BLOCK_N, 128] in the activation dtype along the virtual k."""
    if USE_ASM:
        ASM: tl.constexpr = DEQUANT_FP16_ASM if FP16 else DEQUANT_BF16_ASM
        r0, r1, r2, r3 = tl.inline_asm_elementwise(
            ASM, "=r,=r,=r,=r,r", [q], dtype=(tl.int32, tl.int32, tl.int32, tl.int32), is_pure=True, pack=1)
    else:
        r0 = _pair(q, 0, -8.0, FP16)
        r1 = _pair(q, 1, -8.0, FP16)
        r2 = _pair(q, 2, -8.0, FP16)
        r3 = _pair(q, 3, -8.0, FP16)
    w = tl.reshape(_split_halves(tl.join(tl.join(r0, r1), tl.join(r2, r3))), (B, BLOCK_N, 16, 8))
    if FP16:
        w = w.to(tl.float16, bitcast=True)
    else:
        w = w.to(tl.bfloat16, bitcast=True)
    w7 = tl.reshape(w, (B, BLOCK_N, 4, 4, 2, 2, 2))                    # (b, n, blk, c, tile, half8, pair)
    return tl.reshape(tl.permute(w7, (0, 1, 2, 4, 3, 5, 6)), (B, BLOCK_N, 128))


@triton.jit
def _x_virtual_k(x_ptr, kb, kb1, offs_m, M, stride_xm, B: tl.constexpr, BLOCK_M: tl.constexpr, EVEN_K: tl.constexpr):
    """Activations of blocks kb .. kb + B - 1 as [B, 128, BLOCK_M] along the virtual k = 32 blk + 16 tile
    + 4 c + 2 half8 + pair (true k = 32 blk + 16 tile + 8 half8 + 2 c + pair): loaded along the true,
    contiguous k, then permuted (the MMA operand goes through shared memory anyway)."""
    kk = (kb + tl.arange(0, B))[:, None, None] * 128 + tl.arange(0, 128)[None, :, None]
    mask = (offs_m < M)[None, None, :]
    if not EVEN_K:
        mask = mask & (kk < kb1 * 128)
    xt = tl.load(x_ptr + offs_m[None, None, :] * stride_xm + kk, mask=mask, other=0.0)
    x7 = tl.reshape(xt, (B, 4, 2, 2, 4, 2, BLOCK_M))                   # (b, blk, tile, half8, c, pair, m)
    return tl.reshape(tl.permute(x7, (0, 1, 2, 4, 3, 5, 6)), (B, 128, BLOCK_M))


@triton.jit
def _wk_step(acc3, x_ptr, qw_ptr, s_ptr, kb, kb1, pid_n, offs_n, offs_m, M, N, NG, stride_xm, GROUP: tl.constexpr,
             BLOCK_N: tl.constexpr, BLOCK_M: tl.constexpr, B: tl.constexpr, W: tl.constexpr, USE_ASM: tl.constexpr,
             DOT_F32: tl.constexpr, EVEN_K: tl.constexpr, EVEN_N: tl.constexpr):
    """acc3 [B, BLOCK_N, BLOCK_M] plus blocks kb .. kb + B - 1 (block b on warp b % W), each scaled."""
    bb = tl.arange(0, B)
    q3 = _wk_words(qw_ptr, kb, kb1, pid_n, NG, B, BLOCK_N, W, EVEN_K, EVEN_N)
    xt = _x_virtual_k(x_ptr, kb, kb1, offs_m, M, stride_xm, B, BLOCK_M, EVEN_K)
    s_mask = (offs_n < N)[None, :]
    if not EVEN_K:
        s_mask = s_mask & ((kb + bb) < kb1)[:, None]
    s = tl.load(s_ptr + (((kb + bb) * 128) // GROUP)[:, None] * N + offs_n[None, :], mask=s_mask,
                other=0.0).to(tl.float32)
    w = _dequant_virtual_k(q3, B, BLOCK_N, USE_ASM, tl.constexpr(x_ptr.dtype.element_ty == tl.float16))
    if DOT_F32:
        part = tl.dot(w.to(tl.float32), xt.to(tl.float32))
    else:
        part = tl.dot(w, xt)
    return acc3 + part * s[:, :, None]


@triton.jit
def _w4a16_wk_kernel(x_ptr, qw_ptr, s_ptr, y_ptr, ws_ptr, cnt_ptr, M, N, K, stride_xm, stride_ym, split_k,
                     GROUP: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_M: tl.constexpr, B: tl.constexpr,
                     W: tl.constexpr, USE_ASM: tl.constexpr, DOT_F32: tl.constexpr, EVEN_K: tl.constexpr,
                     EVEN_N: tl.constexpr, ONE_M_TILE: tl.constexpr, RED: tl.constexpr, STAGES: tl.constexpr,
                     PDL: tl.constexpr = False):
    pid_n, pid_k, pid_m, offs_n, offs_m, n_mask, m_mask, kb0, kb1 = _tile_setup(M, N, K, split_k, BLOCK_N, BLOCK_M, B)
    if ONE_M_TILE:        # M <= BLOCK_M: with M specialised to 1, the masks of columns >= 1 fold away
        offs_m = tl.arange(0, BLOCK_M)
        m_mask = offs_m < M
    pdl_wait(PDL)
    NG = N // 16
    acc3 = tl.zeros((B, BLOCK_N, BLOCK_M), tl.float32)
    if STAGES > 1:        # Triton's software pipeline: STAGES - 1 steps of loads in flight (cp.async)
        for kb in tl.range(kb0, kb1, B, num_stages=STAGES):
            acc3 = _wk_step(acc3, x_ptr, qw_ptr, s_ptr, kb, kb1, pid_n, offs_n, offs_m, M, N, NG, stride_xm, GROUP,
                            BLOCK_N, BLOCK_M, B, W, USE_ASM, DOT_F32, EVEN_K, EVEN_N)
    else:
        for kb in range(kb0, kb1, B):
            acc3 = _wk_step(acc3, x_ptr, qw_ptr, s_ptr, kb, kb1, pid_n, offs_n, offs_m, M, N, NG, stride_xm, GROUP,
                            BLOCK_N, BLOCK_M, B, W, USE_ASM, DOT_F32, EVEN_K, EVEN_N)
    store_split_k(tl.sum(acc3, 0), y_ptr, ws_ptr, cnt_ptr, pid_m * tl.num_programs(0) + pid_n, pid_k, split_k,
                  offs_m, offs_n, m_mask[None, :] & n_mask[:, None], M, N, stride_ym, RED)


def wk_kernel_constexprs(cfg, M: int, N: int, K: int, group: int, use_asm: bool, dot_f32: bool) -> dict:
    """The compile-time arguments `_w4a16_wk_kernel` is launched with (also what tools/sass_loops.py
    compiles offline). EVEN_K: every split's blocks are whole steps (no masked block)."""
    nkb = K // 128
    per = split_blocks(K, launch_split(cfg, K), cfg.wk)
    return dict(GROUP=group, BLOCK_N=cfg.block_n, BLOCK_M=cfg.block_m, B=cfg.wk, W=cfg.num_warps, USE_ASM=use_asm,
                DOT_F32=dot_f32, EVEN_K=nkb % per == 0, EVEN_N=N % cfg.block_n == 0, ONE_M_TILE=M <= cfg.block_m,
                RED=cfg.reduce, STAGES=cfg.num_stages)


def launch_wk(x, qweight, scales, y, ws, cnt, grid, split, group, cfg, use_asm, dot_f32):
    """The `wk` launch of triton_tc.w4a16_tc (same arguments and split-K workspace)."""
    M, K = x.shape
    N = qweight.shape[1] * 16
    assert group % 128 == 0, "the warp-split-K kernel takes groups of 128 rows or more"
    _w4a16_wk_kernel[grid](
        x, qweight, scales, y, ws, cnt, M, N, K, x.stride(0), y.stride(0), split,
        **wk_kernel_constexprs(cfg, M, N, K, group, use_asm, dot_f32), num_warps=cfg.num_warps,
        num_stages=cfg.num_stages,
        **launch_args(x.device))

"""W4A16 tensor-core kernel with the packed words fetched by Hopper TMA (TCConfig `tma`; our own
Triton, the same math as triton_tc.py, whose docstring says why hand-written).

Why a second loop: the default kernel loads its words with per-lane `tl.load`s into registers, so
the bytes in flight are bounded by registers (127 at unroll 4 -> 4 CTAs/SM) and between load rounds
DRAM idles (Nsight Compute at M=1: 3.3 warps/scheduler, scoreboard/barrier stalls, ~50% of the copy
ceiling on gate/up). Here the [BLOCK_N/16, 256] word tile of a 128-row block (4 KB at BLOCK_N 64)
is one TMA copy (`cp.async.bulk.tensor`) into shared memory, in a `tl.range(num_stages=S)` loop,
so Triton multi-buffers S tiles behind mbarriers: one instruction per tile instead of one per
lane, no registers held by the loads in flight, and S-1 tiles (4-8 KB each) outstanding per CTA
while the current one is dequantized and multiplied.

The words are viewed as a 2-D [K/128 * N/16, 256] int32 tensor (row kb*NG + g, NG = N/16: 1 KB
per row group, contiguous). The tile of (kb, pid_n) is rows kb*NG + pid_n*BLOCK_N/16 .. +
BLOCK_N/16. When N is not a multiple of BLOCK_N the last tile's extra rows are the next block's
words (or TMA's zero fill past the end): finite weights in output rows >= N, which are masked
at the store, so any N % 16 == 0 works. After the load the tile is reshaped to the [BLOCK_N, 16]
tile `_load_words` gives (row n = 16g + 8n8 + nlo, word 4blk + c; column n8*128 + nlo*16 + 4c +
blk): only the last two axes swap, and Triton folds the layout the dequantization wants into the
shared-memory load (checked in the sm_90 TTGIR of triton 3.6 and 3.9: unswizzled words, one
`local_load` straight into that layout (two LDS.128 per lane and block at BLOCK_N 64), no
convert_layout in the loop, no spills).

Scales (groups >= 128) come by TMA too, a [1, BLOCK_N] box per block: a plain load would not be
pipelined (its use is after the MMA) and stalls every iteration. Activations: `tma=1` plain loads
(the pipeliner makes them a cp.async stage), `tma=2` a [BLOCK_M, 128] TMA box (rows >= M are zero
fill; unaligned activations are copied first). `tma_blocks=2` (spec tkb=2) fetches two 128-row
blocks per copy through the 3-D view [K/128, N/16, 256] (its N overhang is zero fill): half the
per-copy mbarrier / address work per weight; splits then hold whole pairs (K/128 even).

Offline sm_90 SASS of the loop per 64 weights and thread (default un4: 164): BLOCK_N 64 / 4 warps
229 (71 registers), BLOCK_N 128 / 4 warps 177 (128 registers), with two blocks per copy 192 and
154 (95 / 168 registers); about 90 of them are the dequantization, the rest mbarrier waits,
block-wide bar.syncs around each TMA issue, and descriptor / MMA address work (benchmarks/
w4a16_bench.py TMA_GRID lists the specs with registers and shared memory).

Measured on the H200 (BENCHMARKS.md, W4A16 session 6): faster than the register kernel on the
engine's 8704/16384/32768-row and 4096x16384 projections (most at M=8, where the register kernel
runs out of registers for loads in flight), so tc_config.TC_SHAPE_DEFAULTS routes those here;
BLOCK_N 16 faulted (misaligned address), hence TMA_MIN_BLOCK_N = 64.

`GLU` (the engine's gate/up projection, N = [gate | up]): each tile takes BLOCK_N/32 row groups of
the gate half and the same ones of the up half, one box of the 4-D view [K/128, 2, N/32, 256] (scales:
[groups, 2, N/2]), so its accumulator holds both projections of BLOCK_N/2 outputs and the split-K store
writes silu(gate)·up (split_k.py): the MLP's silu_mul kernel and the [M, N] round trip are gone, and
the checkpoint and the in-memory layout stay as they are. H200 (BENCHMARKS.md, W4A16 session 23):
gate+up + silu_mul 23.2 -> 22.4 us at M = 1, 23.0 -> 21.8 at M = 8, bit-equal.

`early` (spec ew=E): E times the first `stages - 1` word tiles are prefetched into L2 before the PDL wait
(triton_tc._prefetch_then_wait), so the pipeline's first copies hit L2.

The descriptors are built per call on the host (no sync: CUDA-graph capturable; the launcher
encodes them at launch). `tl.range` over tensor bounds does not run in triton 3.6's interpreter
(3.9's does). Import lazily: CPU-only installs have no triton.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from salactl.runtime.ops.pdl import launch_args
from salactl.runtime.ops.split_k import store_split_k
from salactl.runtime.ops.w4a16.tc_config import split_blocks
from salactl.runtime.ops.w4a16.triton_tc import _mma_block, _prefetch_then_wait, _tile_setup


@triton.jit
def _arrange_words(q2, BLOCK_N: tl.constexpr):
    """[BLOCK_N/16, 256] words of one block -> the [BLOCK_N, 16] tile `_load_words` gives."""
    q5 = tl.reshape(q2, (BLOCK_N // 16, 2, 8, 4, 4))                           # (g, n8, nlo, c, blk)
    return tl.reshape(tl.permute(q5, (0, 1, 2, 4, 3)), (BLOCK_N, 16))


@triton.jit
def _glu_words(qw_desc, kb, pid_n, BLOCK_N: tl.constexpr, KBP: tl.constexpr):
    """GLU: blocks kb .. kb + KBP - 1 of the tile's BLOCK_N/32 gate row groups then the same up row
    groups, one [KBP, 2, BLOCK_N/32, 256] box of the [K/128, 2, N/32, 256] view -> [KBP, BLOCK_N/16, 256]."""
    return tl.reshape(qw_desc.load([kb, 0, pid_n * (BLOCK_N // 32), 0]), (KBP, BLOCK_N // 16, 256))


@triton.jit
def _tma_words(qw_desc, kb, pid_n, NG, BLOCK_N: tl.constexpr, GLU: tl.constexpr):
    """The [BLOCK_N, 16] word tile of block kb (as `_load_words`), from one TMA copy."""
    if GLU:
        q2 = tl.reshape(_glu_words(qw_desc, kb, pid_n, BLOCK_N, 1), (BLOCK_N // 16, 256))
    else:
        q2 = qw_desc.load([kb * NG + pid_n * (BLOCK_N // 16), 0])             # [BLOCK_N/16, 256]
    return _arrange_words(q2, BLOCK_N)


@triton.jit
def _tma_word_pair(qw3_desc, kb, pid_n, BLOCK_N: tl.constexpr, GLU: tl.constexpr):
    """The word tiles of blocks kb and kb + 1 from one [2, BLOCK_N/16, 256] TMA copy of the 3-D view."""
    if GLU:
        q3 = _glu_words(qw3_desc, kb, pid_n, BLOCK_N, 2)
    else:
        q3 = qw3_desc.load([kb, pid_n * (BLOCK_N // 16), 0])                  # [2, BLOCK_N/16, 256]
    q6 = tl.reshape(q3, (2, BLOCK_N // 16, 2, 8, 4, 4))                        # (kb, g, n8, nlo, c, blk)
    return tl.split(tl.reshape(tl.permute(q6, (1, 2, 3, 5, 4, 0)), (BLOCK_N, 16, 2)))


@triton.jit
def _tma_scales(s_desc, r0, pid_n, BLOCK_N: tl.constexpr, KBP: tl.constexpr, GLU: tl.constexpr):
    """Scales [KBP, BLOCK_N] of group rows r0 .. r0 + KBP - 1 (GLU: the gate then the up columns, a
    [KBP, 2, BLOCK_N/2] box of the [groups, 2, N/2] view)."""
    if GLU:
        return tl.reshape(s_desc.load([r0, 0, pid_n * (BLOCK_N // 2)]), (KBP, BLOCK_N))
    else:
        return s_desc.load([r0, pid_n * BLOCK_N])


@triton.jit
def _x_block(x_ptr, x_desc, kb, pid_m, offs_m, m_mask, stride_xm, BLOCK_M: tl.constexpr, TMA_X: tl.constexpr):
    """Activations of block kb as the MMA's [128, BLOCK_M] operand."""
    if TMA_X:
        # rows >= M of the [BLOCK_M, 128] box are TMA's zero fill (no memory traffic)
        return tl.trans(x_desc.load([pid_m * BLOCK_M, kb * 128]))
    else:
        return tl.load(x_ptr + offs_m[None, :] * stride_xm + (kb * 128 + tl.arange(0, 128))[:, None],
                       mask=m_mask[None, :], other=0.0)


@triton.jit
def _w4a16_tma_kernel(x_ptr, x_desc, qw_desc, s_desc, s_ptr, y_ptr, ws_ptr, cnt_ptr, M, N, K, stride_xm, stride_ym,
                      split_k, bias, GROUP: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_M: tl.constexpr,
                      USE_ASM: tl.constexpr, DOT_F32: tl.constexpr, BIAS_DOT: tl.constexpr,
                      STAGES: tl.constexpr, RED: tl.constexpr, TMA_X: tl.constexpr, KBP: tl.constexpr,
                      qw_ptr, EARLY: tl.constexpr = 0, PDL: tl.constexpr = False, GLU: tl.constexpr = False):
    pid_n, pid_k, pid_m, offs_n, offs_m, n_mask, m_mask, kb0, kb1 = _tile_setup(M, N, K, split_k, BLOCK_N, BLOCK_M,
                                                                                KBP)
    _prefetch_then_wait(qw_ptr, kb0, kb1, pid_n, N // 16, BLOCK_N, EARLY, PDL)   # EARLY: blocks to prefetch
    NG = N // 16
    acc = tl.zeros((BLOCK_N, BLOCK_M), tl.float32)
    neg_bias = tl.full((BLOCK_N, 128), bias, tl.float32).to(x_ptr.dtype.element_ty)
    for kb in tl.range(kb0, kb1, KBP, num_stages=STAGES):
        if KBP == 1:
            q = _tma_words(qw_desc, kb, pid_n, NG, BLOCK_N, GLU)
            xt = _x_block(x_ptr, x_desc, kb, pid_m, offs_m, m_mask, stride_xm, BLOCK_M, TMA_X)
            if GROUP < 128:
                s = tl.zeros((BLOCK_N,), tl.float32)
            else:
                # a [1, BLOCK_N] box of the [groups, N] scales: pipelined with the words (a plain
                # load here would not be, its use is after the MMA)
                s = tl.reshape(_tma_scales(s_desc, (kb * 128) // GROUP, pid_n, BLOCK_N, 1, GLU), (BLOCK_N,)).to(tl.float32)
            acc = _mma_block(acc, neg_bias, q, xt, s, s_ptr, kb, kb1, offs_n, N, GROUP, BLOCK_N,
                             USE_ASM, DOT_F32, BIAS_DOT)
        else:
            # two 128-row blocks per copy (K/128 even, splits of whole pairs): half the per-copy
            # mbarrier / address work per weight
            qa, qb = _tma_word_pair(qw_desc, kb, pid_n, BLOCK_N, GLU)
            xa = _x_block(x_ptr, x_desc, kb, pid_m, offs_m, m_mask, stride_xm, BLOCK_M, TMA_X)
            xb = _x_block(x_ptr, x_desc, kb + 1, pid_m, offs_m, m_mask, stride_xm, BLOCK_M, TMA_X)
            if GROUP < 128:
                sa = tl.zeros((BLOCK_N,), tl.float32)
                sb = sa
            else:
                # a [2, BLOCK_N] box from block kb's group row; block kb + 1 uses its second row only
                # when it starts a new group
                r0 = (kb * 128) // GROUP
                sa, sb = tl.split(tl.permute(_tma_scales(s_desc, r0, pid_n, BLOCK_N, 2, GLU), (1, 0)).to(tl.float32))
                sb = tl.where(((kb + 1) * 128) // GROUP == r0, sa, sb)
            acc = _mma_block(acc, neg_bias, qa, xa, sa, s_ptr, kb, kb1, offs_n, N, GROUP, BLOCK_N,
                             USE_ASM, DOT_F32, BIAS_DOT)
            acc = _mma_block(acc, neg_bias, qb, xb, sb, s_ptr, kb + 1, kb1, offs_n, N, GROUP, BLOCK_N,
                             USE_ASM, DOT_F32, BIAS_DOT)
    store_split_k(acc, y_ptr, ws_ptr, cnt_ptr, pid_m * tl.num_programs(0) + pid_n, pid_k, split_k, offs_m, offs_n,
                  m_mask[None, :] & n_mask[:, None], M, N, stride_ym, RED, pid_n * (BLOCK_N // 2), GLU)


def word_descriptor(qweight: torch.Tensor, block_n: int, blocks: int = 1, glu: bool = False) -> TensorDescriptor:
    """qweight [K/128, N/16, 256] int32 as the 2-D [K/128 * N/16, 256] TMA view, box [block_n/16, 256]
    (blocks = 1), or as itself with box [blocks, block_n/16, 256]; glu: as [K/128, 2, N/32, 256] (the
    gate and the up half) with box [blocks, 2, block_n/32, 256]."""
    if glu:
        kb, ng, _ = qweight.shape
        view = qweight.view(kb, 2, ng // 2, 256)
        return TensorDescriptor(view, list(view.shape), list(view.stride()), [blocks, 2, block_n // 32, 256])
    if blocks > 1:
        return TensorDescriptor(qweight, list(qweight.shape), list(qweight.stride()),
                                [blocks, block_n // 16, 256])
    rows = qweight.shape[0] * qweight.shape[1]
    return TensorDescriptor(qweight, [rows, 256], [256, 1], [block_n // 16, 256])


def scale_descriptor(scales: torch.Tensor, block_n: int, blocks: int, glu: bool) -> TensorDescriptor:
    """scales [groups, N] (contiguous) with box [blocks, block_n]; glu: as [groups, 2, N/2] with box
    [blocks, 2, block_n/2]."""
    if glu:
        view = scales.view(scales.shape[0], 2, scales.shape[1] // 2)
        return TensorDescriptor(view, list(view.shape), list(view.stride()), [blocks, 2, block_n // 2])
    return TensorDescriptor(scales, list(scales.shape), [scales.stride(0), 1], [blocks, block_n])


def _aligned(t: torch.Tensor) -> bool:
    return t.data_ptr() % 16 == 0 and all((st * t.element_size()) % 16 == 0 for st in t.stride()[:-1])


def launch_tma(x, qweight, scales, y, ws, cnt, grid, split, neg_bias, group, cfg, use_asm, dot_f32, glu=False):
    """The `tma` launch of triton_tc.w4a16_tc (same arguments and split-K workspace): tma=1 words and
    scales by TMA, activations by plain loads (cp.async stages); tma=2 activations by TMA too;
    tma_blocks = 2: two 128-row blocks per copy (K/128 must be even). glu: y [M, N/2] gets
    silu(gate)·up of the [gate | up] weight (tc_config.glu_epilogue_ok says when); its L2 prefetch
    (cfg.early) is off, because a tile's words are then two ranges."""
    M, K = x.shape
    assert (K // 128) % cfg.tma_blocks == 0, "tma_blocks must divide K/128"
    N = qweight.shape[1] * 16
    tma_x = cfg.tma == 2
    if tma_x and not _aligned(x):          # TMA needs a 16-byte aligned base and row stride
        x = x.clone(memory_format=torch.contiguous_format)
    if not _aligned(scales) or scales.stride(-1) != 1 or (glu and not scales.is_contiguous()):
        scales = scales.clone(memory_format=torch.contiguous_format)
    if scales.shape[0] < cfg.tma_blocks:   # one group: keep the [2, BLOCK_N] box inside the tensor
        scales = scales.repeat(cfg.tma_blocks, 1)
    x_desc = TensorDescriptor(x, [M, K], [x.stride(0), 1], [cfg.block_m, 128]) if tma_x else x
    early = 0 if glu else cfg.prefetch_blocks(split_blocks(K, split, cfg.tma_blocks))
    _w4a16_tma_kernel[grid](
        x, x_desc, word_descriptor(qweight, cfg.block_n, cfg.tma_blocks, glu),
        scale_descriptor(scales, cfg.block_n, cfg.tma_blocks, glu), scales, y, ws, cnt, M, N, K,
        x.stride(0), y.stride(0), split, neg_bias, GROUP=group, BLOCK_N=cfg.block_n, BLOCK_M=cfg.block_m,
        USE_ASM=use_asm, DOT_F32=dot_f32, BIAS_DOT=cfg.bias_dot, STAGES=cfg.num_stages, RED=cfg.reduce,
        TMA_X=tma_x, KBP=cfg.tma_blocks, qw_ptr=qweight, EARLY=early, GLU=glu, num_warps=cfg.num_warps,
        num_stages=cfg.num_stages, **launch_args(x.device))

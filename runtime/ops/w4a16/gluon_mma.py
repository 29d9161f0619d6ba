"""W4A16 for 1-8 activation rows on warp-level tensor cores (mma.sync m16n8k16), written in Gluon
(Triton's explicit-layout dialect) so that every register is where we put it.

Why not the Triton kernels (triton_tc.py) here: Triton on sm_90 lowers a dot to wgmma, whose B operand
(the activations) must come through shared memory with a CTA barrier per step, and its loads come in
rounds; the split-K that keeps enough bytes in flight then costs a global sum (1.3-1.9 us per call,
BENCHMARKS.md session 14). Here each warp owns whole 128-row K blocks of its CTA's output rows and
runs the MMAs itself: both operands live in registers (no shared memory until the one cross-warp sum
at the end), and the K split is across the warps of one CTA, so there is no global split-K at all.

One thread = one lane of the m16n8k16 fragments. For a 16-row slab g and K block kb, the lane's two
16-byte words loads (pack_tc, n8 = 0 / 1, words blk = 0..3) hold rows nlo and nlo + 8 (nlo = lane/4) at
k = 32 blk + 16 tile + 8 half8 + 2c + pair (c = lane % 4): exactly the A fragments of the block's 8
k16 MMAs (layout.py). The activations are the B fragment (n = token = lane/4, k = 2c + pair + 8 half8),
one 32-bit load per register. One inline-PTX block per (K block, slab) dequantizes the 8 words
(lop3 + fma.bf16x2 per pair, as triton_tc.py) and chains the 8 MMAs; its fp32 d0..d3 (rows nlo /
nlo+8, tokens 2c / 2c+1) are scaled by the group scale and summed in registers, then across warps.
Every tensor has one element per thread per register index ([W warps, 32 lanes, U blocks, R slabs]),
so "elementwise" inline asm is per-lane fragment code.
"""

from __future__ import annotations

import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl

from salactl.runtime.ops.w4a16.layout import K_BLOCK, TC_ROWS


def _block_asm(fp16: bool, bias_mma: bool) -> str:
    """PTX: 8 words ($4..$11: n8 = 0 blk 0..3, n8 = 1 blk 0..3) and 16 activation registers ($12..$27:
    k16 tile t, half h at 12 + 2t + h) -> d0..d3 ($0..$3) of the K block's 8 chained MMAs.

    bias_mma: the words are dequantized to magic + q only (lop3, no fma), and the chain starts from
    the MMA of a constant -(magic + 8) tile with the same activations (exact: fp32 accumulation of
    products exact in fp32)."""
    magic, one, bias = ("0x64006400", "0x3C003C00", "0xE408E408") if fp16 else ("0x43004300", "0x3F803F80", "0xC308C308")
    ty = "f16" if fp16 else "bf16"
    mma = f"mma.sync.aligned.m16n8k16.row.col.f32.{ty}.{ty}.f32"
    lines = ["{", ".reg .b32 t, one, bias, lo<4>, hi<4>;", ".reg .f32 z;", f"mov.b32 one, {one};",
             f"mov.b32 bias, {bias};", "mov.f32 z, 0f00000000;"]
    first = True
    if bias_mma:
        for t in range(8):
            c = "{z, z, z, z}" if first else "{$0, $1, $2, $3}"
            lines.append(f"{mma} {{$0, $1, $2, $3}}, {{bias, bias, bias, bias}}, {{${12 + 2 * t}, ${13 + 2 * t}}}, {c};")
            first = False
    for blk in range(4):
        for name, word in (("lo", 4 + blk), ("hi", 8 + blk)):
            for i in range(4):
                src = f"${word}"
                if i:
                    lines.append(f"shr.u32 t, ${word}, {4 * i};")
                    src = "t"
                lines.append(f"lop3.b32 {name}{i}, {src}, 0x000F000F, {magic}, 0xEA;")
                if not bias_mma:
                    lines.append(f"fma.rn.{ty}x2 {name}{i}, {name}{i}, one, bias;")
        for tile in range(2):
            t = 2 * blk + tile
            c = "{z, z, z, z}" if first else "{$0, $1, $2, $3}"
            lines.append(f"{mma} {{$0, $1, $2, $3}}, {{lo{tile}, hi{tile}, lo{2 + tile}, hi{2 + tile}}}, "
                         f"{{${12 + 2 * t}, ${13 + 2 * t}}}, {c};")
            first = False
    return "\n".join(lines + ["}"])


BLOCK_ASM = {(fp16, bias): gl.constexpr(_block_asm(fp16, bias)) for fp16 in (False, True) for bias in (False, True)}
BLOCK_ASM_BF16 = BLOCK_ASM[(False, False)]
BLOCK_ASM_FP16 = BLOCK_ASM[(True, False)]
BIASED_ASM_BF16 = BLOCK_ASM[(False, True)]
BIASED_ASM_FP16 = BLOCK_ASM[(True, True)]


@gluon.constexpr_function
def _axis_layout(layout, dim, rank):
    """The 1-D layout of axis `dim` of a rank-`rank` layout (every other axis sliced away)."""
    for d in reversed(range(rank)):
        if d != dim:
            layout = gl.SliceLayout(d, layout)
    return layout


@gluon.jit
def _axis(n: gl.constexpr, dim: gl.constexpr, layout: gl.constexpr, rank: gl.constexpr):
    """arange(n) along axis `dim`, expanded to rank `rank` (broadcastable) in `layout`."""
    i = gl.arange(0, n, layout=_axis_layout(layout, dim, rank))
    for d in gl.static_range(rank):
        if d != dim:
            i = gl.expand_dims(i, d)
    return i


@gluon.jit
def _split8(v):
    """v [..., 2, 2, 2] -> its 8 slices in flat index order 4a + 2b + c of the last three axes."""
    c0, c1 = gl.split(v)
    c0b0, c0b1 = gl.split(c0)
    c1b0, c1b1 = gl.split(c1)
    i0, i4 = gl.split(c0b0)
    i2, i6 = gl.split(c0b1)
    i1, i5 = gl.split(c1b0)
    i3, i7 = gl.split(c1b1)
    return i0, i1, i2, i3, i4, i5, i6, i7


@gluon.jit
def _ld_v4(ptrs):
    """16-byte loads of 4 consecutive int32 per thread, not allocated in L1 (streamed once). Not .nc:
    ptxas moves read-only (.nc) loads across barriers, so a fence would not hold them."""
    return gl.inline_asm_elementwise("ld.global.L1::no_allocate.v4.b32 {$0, $1, $2, $3}, [$4];",
                                     "=r,=r,=r,=r,l,l,l,l", [ptrs], dtype=gl.int32, is_pure=False, pack=4)


@gluon.jit
def _ld_scale(ptrs, ok):
    """The int32 holding an fp16 scale's 16 bits (0 where not ok)."""
    return gl.inline_asm_elementwise(
        "{ .reg .pred p; .reg .b16 h; setp.ne.b32 p, $2, 0; mov.b16 h, 0; @p ld.global.nc.b16 h, [$1]; "
        "cvt.u32.u16 $0, h; }", "=r,l,r", [ptrs, ok.to(gl.int32)], dtype=gl.int32, is_pure=False, pack=1)


@gluon.jit
def _words_scales(kb0, w_base, word_c, s_ptr, kb6, kb4, row4, NG, N, KB, GROUP: gl.constexpr):
    """Words and scales of blocks kb0 + (kb6 / kb4: each register's block offset). Blocks past the
    last one are clamped, not masked (no select per register): they get scale 0. Slabs >= NG were
    clamped by the caller and are never stored."""
    words = _ld_v4(w_base + gl.minimum(kb0 + kb6, KB - 1) * (NG * 256) + word_c)
    kb = kb0 + kb4
    s_off = ((gl.minimum(kb, KB - 1) * 128) // GROUP) * N + row4
    return words, _ld_scale(s_ptr + s_off, kb < KB), _ld_scale(s_ptr + s_off + 8, kb < KB)


@gluon.jit
def _acts(kb0, x_base, x_c, kbx, KB):
    """The activation registers of blocks kb0 + kbx (tokens >= M were clamped by the caller)."""
    return gl.load(x_base + gl.minimum(kb0 + kbx, KB - 1) * 64 + x_c)


@gluon.jit
def _fence(anchor, FENCE: gl.constexpr):
    """A scheduling fence after a step's loads: ptxas sinks a global load to just before its use but
    never across a barrier (memory ordering), so the loads issued above stay issued above.
    FENCE 1: bar.warp.sync (the warp only), 2: a CTA barrier."""
    if FENCE == 1:
        gl.inline_asm_elementwise("bar.warp.sync -1; mov.u32 $0, 0;", "=r,r", [anchor], dtype=gl.int32,
                                  is_pure=False, pack=1)
    elif FENCE == 2:
        gl.thread_barrier()


@gluon.jit
def _f16_bits_to_f32(v):
    return v.to(gl.int16).to(gl.float16, bitcast=True).to(gl.float32)


@gluon.jit
def _step(acc0, acc1, acc2, acc3, words, xv, s_lo, s_hi, W: gl.constexpr, U: gl.constexpr, R: gl.constexpr,
          L4: gl.constexpr, L3: gl.constexpr, FP16: gl.constexpr, BIAS_MMA: gl.constexpr):
    d0, d1, d2, d3 = _block_mmas(words, xv, W, U, R, L4, L3, FP16, BIAS_MMA)
    lo = _f16_bits_to_f32(s_lo)
    hi = _f16_bits_to_f32(s_hi)
    return acc0 + d0 * lo, acc1 + d1 * lo, acc2 + d2 * hi, acc3 + d3 * hi


@gluon.jit
def _block_mmas(words, xv, W: gl.constexpr, U: gl.constexpr, R: gl.constexpr, L4: gl.constexpr, L3: gl.constexpr,
                FP16: gl.constexpr, BIAS_MMA: gl.constexpr):
    """d0..d3 [W, 32, U, R] of each (block, slab): the inline-PTX block (_block_asm) per lane."""
    q0, q1, q2, q3, q4, q5, q6, q7 = _split8(gl.reshape(words, [W, 32, U, R, 2, 2, 2]))
    xh0, xh1 = gl.split(gl.reshape(xv, [W, 32, U, 2, 2, 2, 2]))         # h = 0 / 1, then t = 4a + 2b + c
    a0, a1, a2, a3, a4, a5, a6, a7 = _split8(xh0)
    b0, b1, b2, b3, b4, b5, b6, b7 = _split8(xh1)
    if BIAS_MMA:
        ASM: gl.constexpr = BIASED_ASM_FP16 if FP16 else BIASED_ASM_BF16
    else:
        ASM: gl.constexpr = BLOCK_ASM_FP16 if FP16 else BLOCK_ASM_BF16
    return gl.inline_asm_elementwise(
        ASM, "=f,=f,=f,=f" + ",r" * 24,
        [_l4(q0, L4), _l4(q1, L4), _l4(q2, L4), _l4(q3, L4), _l4(q4, L4), _l4(q5, L4), _l4(q6, L4), _l4(q7, L4),
         _x4(a0, L3), _x4(b0, L3), _x4(a1, L3), _x4(b1, L3), _x4(a2, L3), _x4(b2, L3), _x4(a3, L3), _x4(b3, L3),
         _x4(a4, L3), _x4(b4, L3), _x4(a5, L3), _x4(b5, L3), _x4(a6, L3), _x4(b6, L3), _x4(a7, L3), _x4(b7, L3)],
        dtype=(gl.float32, gl.float32, gl.float32, gl.float32), is_pure=False, pack=1)


@gluon.jit
def _prefetch_tiles(qw_ptr, pid, NG, KB, R: gl.constexpr, W: gl.constexpr):
    """One bulk L2 prefetch per K block of this CTA's slabs (R contiguous 1 KB tiles), spread over
    the lanes (block kb = w + W·lane, as the warps' loops take them): every byte the CTA will read is
    requested from DRAM at once. ptxas issues the loads themselves just before their MMAs (one
    DRAM round trip per block and warp otherwise); with this they hit L2."""
    LP: gl.constexpr = gl.BlockedLayout([1, 1], [1, 32], [W, 1], [1, 0])
    w = gl.expand_dims(gl.arange(0, W, layout=gl.SliceLayout(1, LP)), 1)
    lane = gl.expand_dims(gl.arange(0, 32, layout=gl.SliceLayout(0, LP)), 0)
    slabs = gl.minimum(NG - pid * R, R)
    for j in gl.static_range(0, 4):
        kb = w + W * (lane + 32 * j)
        ok = kb < KB
        ptr = qw_ptr + (gl.minimum(kb, KB - 1) * NG + pid * R) * 256
        gl.inline_asm_elementwise(
            "{ .reg .pred p; setp.ne.b32 p, $2, 0; @p cp.async.bulk.prefetch.L2.global [$1], $3; mov.u32 $0, 0; }",
            "=r,l,r,r", [ptr, ok.to(gl.int32), kb * 0 + slabs * 1024], dtype=gl.int32, is_pure=False, pack=1)


@gluon.jit
def _w4a16_mma_kernel(x_ptr, qw_ptr, s_ptr, y_ptr, M, N, K, stride_xm, stride_ym,
                      GROUP: gl.constexpr, R: gl.constexpr, W: gl.constexpr, U: gl.constexpr,
                      FP16: gl.constexpr, BIAS_MMA: gl.constexpr, PF: gl.constexpr, FENCE: gl.constexpr,
                      PDL: gl.constexpr):
    # [warp, lane, block u, slab r, n8, blk]: one 16-byte words load per (u, r, n8) and lane
    L6: gl.constexpr = gl.BlockedLayout([1, 1, U, R, 2, 4], [1, 32, 1, 1, 1, 1], [W, 1, 1, 1, 1, 1], [5, 4, 3, 2, 1, 0])
    # [warp, lane, block u, k16 tile t, half h]: the activation registers
    LX: gl.constexpr = gl.BlockedLayout([1, 1, U, 8, 2], [1, 32, 1, 1, 1], [W, 1, 1, 1, 1], [4, 3, 2, 1, 0])
    # [warp, lane, block u, slab r]: one element per fragment set
    L4: gl.constexpr = gl.BlockedLayout([1, 1, U, R], [1, 32, 1, 1], [W, 1, 1, 1], [3, 2, 1, 0])
    L3: gl.constexpr = gl.SliceLayout(3, L4)
    NG = N // 16
    KB = K // 128
    pid = gl.program_id(0)

    if PDL:
        gl.inline_asm_elementwise("griddepcontrol.wait; // $0", "=r", [], dtype=gl.int32, is_pure=False, pack=1)
        gl.inline_asm_elementwise("griddepcontrol.launch_dependents; // $0", "=r", [], dtype=gl.int32,
                                  is_pure=False, pack=1)

    # per-lane base addresses plus per-register constants (so the constants become immediate offsets);
    # warp w takes blocks kb0 + u·W + w of each step
    kb6 = _axis(U, 2, L6, 6) * W + _axis(W, 0, L6, 6)
    g6 = gl.minimum(pid * R + _axis(R, 3, L6, 6), NG - 1)
    word_c = _axis(2, 4, L6, 6) * 128 + _axis(4, 5, L6, 6)                     # n8 * 128 + blk
    w_base = qw_ptr + (g6 * 256 + _axis(32, 1, L6, 6) * 4)

    lanex = _axis(32, 1, LX, 5)
    kbx = _axis(U, 2, LX, 5) * W + _axis(W, 0, LX, 5)
    # int32 index of the pair (k, k + 1), k = 16 t + 8 h + 2c within the block (stride_xm is even)
    x_c = _axis(8, 3, LX, 5) * 8 + _axis(2, 4, LX, 5) * 4
    x_base = x_ptr.to(gl.pointer_type(gl.int32), bitcast=True) + \
        (gl.minimum(lanex // 4, M - 1) * (stride_xm // 2) + lanex % 4)

    kb4 = _axis(U, 2, L4, 4) * W + _axis(W, 0, L4, 4)
    row4 = gl.minimum(pid * R + _axis(R, 3, L4, 4), NG - 1) * 16 + _axis(32, 1, L4, 4) // 4

    acc0 = gl.zeros([W, 32, U, R], gl.float32, L4)
    acc1 = gl.zeros([W, 32, U, R], gl.float32, L4)
    acc2 = gl.zeros([W, 32, U, R], gl.float32, L4)
    acc3 = gl.zeros([W, 32, U, R], gl.float32, L4)
    STEP: gl.constexpr = U * W
    # Every step: the words (and scales) first, then the fence, then this step's activations, then
    # its MMAs. ptxas schedules loads late and math early, but no load crosses the CTA barrier
    # (FENCE 2), and the MMAs need the activations loaded after it: so the words of a step are
    # issued before any MMA that follows them in the source.
    if PF == 2:
        wa, sa_lo, sa_hi = _words_scales(0, w_base, word_c, s_ptr, kb6, kb4, row4, NG, N, KB, GROUP)
        wb, sb_lo, sb_hi = _words_scales(STEP, w_base, word_c, s_ptr, kb6, kb4, row4, NG, N, KB, GROUP)
        for kb0 in range(0, KB, STEP):
            wc, sc_lo, sc_hi = _words_scales(kb0 + 2 * STEP, w_base, word_c, s_ptr, kb6, kb4, row4, NG, N, KB, GROUP)
            _fence(kb4, FENCE)
            xa = _acts(kb0, x_base, x_c, kbx, KB)
            acc0, acc1, acc2, acc3 = _step(acc0, acc1, acc2, acc3, wa, xa, sa_lo, sa_hi, W, U, R, L4, L3, FP16, BIAS_MMA)
            wa, sa_lo, sa_hi = wb, sb_lo, sb_hi
            wb, sb_lo, sb_hi = wc, sc_lo, sc_hi
    elif PF == 1:
        wa, sa_lo, sa_hi = _words_scales(0, w_base, word_c, s_ptr, kb6, kb4, row4, NG, N, KB, GROUP)
        for kb0 in range(0, KB, STEP):
            wb, sb_lo, sb_hi = _words_scales(kb0 + STEP, w_base, word_c, s_ptr, kb6, kb4, row4, NG, N, KB, GROUP)
            _fence(kb4, FENCE)
            xa = _acts(kb0, x_base, x_c, kbx, KB)
            acc0, acc1, acc2, acc3 = _step(acc0, acc1, acc2, acc3, wa, xa, sa_lo, sa_hi, W, U, R, L4, L3, FP16, BIAS_MMA)
            wa, sa_lo, sa_hi = wb, sb_lo, sb_hi
    else:
        for kb0 in range(0, KB, STEP):
            wa, sa_lo, sa_hi = _words_scales(kb0, w_base, word_c, s_ptr, kb6, kb4, row4, NG, N, KB, GROUP)
            _fence(kb4, FENCE)
            xa = _acts(kb0, x_base, x_c, kbx, KB)
            acc0, acc1, acc2, acc3 = _step(acc0, acc1, acc2, acc3, wa, xa, sa_lo, sa_hi, W, U, R, L4, L3, FP16, BIAS_MMA)

    # sum over the blocks u, then over the warps; lane (nlo, c) holds rows nlo / nlo + 8, tokens 2c / 2c + 1
    LO: gl.constexpr = gl.SliceLayout(0, gl.SliceLayout(2, L4))                 # [lane, r]
    y0 = gl.sum(gl.sum(acc0, axis=2), axis=0)
    y1 = gl.sum(gl.sum(acc1, axis=2), axis=0)
    y2 = gl.sum(gl.sum(acc2, axis=2), axis=0)
    y3 = gl.sum(gl.sum(acc3, axis=2), axis=0)
    lane = gl.expand_dims(gl.arange(0, 32, layout=gl.SliceLayout(1, LO)), 1)
    row = (pid * R + gl.expand_dims(gl.arange(0, R, layout=gl.SliceLayout(0, LO)), 0)) * 16 + lane // 4
    m = (lane % 4) * 2
    ok = row < N
    out = y_ptr + m * stride_ym + row
    dt = y_ptr.dtype.element_ty
    gl.store(out, y0.to(dt), mask=ok & (m < M))
    gl.store(out + stride_ym, y1.to(dt), mask=ok & (m + 1 < M))
    gl.store(out + 8, y2.to(dt), mask=ok & (m < M))
    gl.store(out + stride_ym + 8, y3.to(dt), mask=ok & (m + 1 < M))


@gluon.jit
def _l4(v, L4: gl.constexpr):
    return gl.convert_layout(v, L4, assert_trivial=True)


@gluon.jit
def _x4(v, L3: gl.constexpr):
    """One activation register [W, 32, U] -> [W, 32, U, 1] (broadcast over the slabs)."""
    return gl.expand_dims(gl.convert_layout(v, L3, assert_trivial=True), 3)


def w4a16_mma(x, qweight, scales, group_size: int, R: int = 1, W: int = 8, U: int = 1, bias_mma: bool = False,
              pf: int = 0, fence: int = 0, pdl: bool = False):
    """x [M <= 8, K] (bf16/fp16) · Wᵀ -> [M, N]; qweight = pack_tc(q) int32 [K/128, N/16, 256], scales
    fp16 [groups, N] with groups of >= 128 rows (group_size -1: one group over K)."""
    import torch

    M, K = x.shape
    N = qweight.shape[1] * TC_ROWS
    assert M <= 8 and qweight.shape[0] * K_BLOCK == K
    group = K if group_size == -1 else group_size
    assert group % 128 == 0
    if x.stride(-1) != 1 or x.stride(0) % 2:
        x = x.contiguous()
    y = torch.empty(M, N, device=x.device, dtype=x.dtype)
    grid = (triton.cdiv(N // 16, R),)
    _w4a16_mma_kernel[grid](x, qweight, scales, y, M, N, K, x.stride(0), y.stride(0), GROUP=group, R=R, W=W, U=U,
                            FP16=x.dtype == torch.float16, BIAS_MMA=bias_mma, PF=int(pf), FENCE=fence, PDL=pdl, num_warps=W, launch_pdl=pdl)
    return y

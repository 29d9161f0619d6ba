"""W8A16 on tensor cores with the weights as the register operand (our own Triton; triton.py says why
hand-written).

The scheme of the W4A16 kernel (runtime/ops/w4a16/triton_tc.py): yᵀ = W·xᵀ, the dequantized weight
tile [BLOCK_N, 64] is the MMA's A operand straight from registers, the activations xᵀ [64, BLOCK_M]
the small B operand, fp32 accumulation. The words are in layout.py's `pack_tc8` order, which is the
W4A16 word order with 64-row blocks, so the kernel reuses its loads (`_load_words`): a lane's two
16-byte loads land where the MMA reads them, no shared-memory round trip.

Dequantization of a word (4 codes u = q + 128; bytes (b0, b2) and (b1, b3) are the two bf16x2
pairs): an 8-bit integer has no exponent trick in bf16 (7 mantissa bits), so each byte is split in
nibbles u = 16h + l, each put under its own magic exponent by one LOP3 (inline PTX):
`lop3(word >> s, 0x000F000F, 0x43004300)` = (128 + l) pairs, and with 0x45004500 (2048, where bf16's
step is 16) = (2048 + 16h) pairs, exactly. One fma (hi − 2304 = 16h − 256, exact) and one more
(lo + that = u − 128: an integer of magnitude ≤ 128, exact in bf16) give the weight: 11
instructions per 4 weights and one MMA. fp16 activations take fp16 magics (1024, and 16384 where
fp16's step is 16). A variant with 3 MMAs per k-tile lost (BENCHMARKS.md, "Tuning notes moved
from code comments"). Under TRITON_INTERPRET=1 (CPU tests) inline
asm cannot run: the same bits come from plain Triton ops (`USE_ASM=False`) and the products run in
fp32; everything after is shared.

The F16 variant (`TC8Config.f16`, o_proj's default at up to 16 rows): fp16 weights 1024 + u from one
PRMT per pair and u − 128 by one sub.f16x2 (4 instructions per 4 weights), fp16 MMA; bf16 activations
are first scaled per 64-row block and column by a power of two that puts the column's largest |x|
in [2^14, 2^15) (exact: bf16's 8 significant bits fit fp16's 11), the partial scaled back.

Scales: groups of 64 rows or more (and per-channel): one fp32 multiply per output element and
64-row block after the MMA. Smaller groups use triton.py's kernels. Split-K in one launch
(runtime/ops/split_k.py). Launch configs: `TC8Config`; benchmarks/w8a16_bench.py times them.
Import lazily: CPU-only installs have no triton.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, fields, replace

import torch
import triton
import triton.language as tl

from salactl.runtime.ops.pdl import launch_args, pdl_wait
from salactl.runtime.ops.split_k import split_counters, store_split_k
from salactl.runtime.ops.w4a16.triton_tc import _half_bits, _load_words, _split_halves
from salactl.runtime.ops.w4a16.tc_config import tc_block_m
from salactl.runtime.ops.w8a16.layout import K_BLOCK8, TC_ROWS, tc8_fits

_INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
MAX_ROWS = 64


@dataclass(frozen=True)
class TC8Config:
    """One launch: output rows per program, warps, 64-row blocks loaded before their MMAs
    (1, 2 or 4), Triton pipeline stages, split K until about `waves` programs per SM exist, and the
    split-K partials the last split sums per load."""
    block_n: int = 64
    warps: int = 4
    unroll: int = 4
    stages: int = 1
    waves: float = 4.0
    red: int = 1
    f16: int = 0

    def split(self, M: int, N: int, K: int, sms: int) -> int:
        """Splits of K in whole 64-row blocks, none of them empty."""
        nkb = K // K_BLOCK8
        tiles = triton.cdiv(N, self.block_n) * triton.cdiv(M, tc_block_m(M))
        split = max(1, min(nkb, round(self.waves * sms / tiles)))
        return triton.cdiv(nkb, triton.cdiv(nkb, split))

    @staticmethod
    def parse(text: str, base: "TC8Config") -> "TC8Config":
        """'bn=64,un=2,stages=3' -> base with those fields (bn, w, un, stages, waves, red)."""
        keys = {"bn": "block_n", "w": "warps", "un": "unroll", "stages": "stages", "waves": "waves", "red": "red",
                "f16": "f16"}
        known = {f.name for f in fields(TC8Config)}
        out = {}
        for item in filter(None, text.replace(" ", "").split(",")):
            key, _, value = item.partition("=")
            name = keys.get(key, key)
            if name not in known or not value:
                raise ValueError(f"bad W8A16 config field {item!r}; fields: {', '.join(keys)}")
            out[name] = float(value) if name == "waves" else int(value)
        return replace(base, **out)


# Keyed by BLOCK_M; TC8_SHAPE_DEFAULTS[(N, K, BLOCK_M)] overrides one shape. Unroll 4 up to 32 rows
# and unroll 1 over 3 cp.async stages at 33-64 rows; K split to about 8 programs per SM for qkvz and
# down at up to 16 rows; at 17-32 rows the sparse projection unroll 2 and gate+up 3 stages: each the
# fastest in `w8a16_bench.py --tc8` sweeps (BENCHMARKS.md, W8A16 session 35).
TC8_DEFAULTS: dict[int, TC8Config] = {16: TC8Config(unroll=4), 32: TC8Config(unroll=4),
                                      64: TC8Config(unroll=1, stages=3)}
# The F16 variant (fp16 weights) only for o_proj at up to 16 rows: it lost or tied on every other
# shape and at 32 rows (BENCHMARKS.md, W8A16 session 35).
TC8_SHAPE_DEFAULTS: dict[tuple[int, int, int], TC8Config] = {
    (4096, 4096, 16): TC8Config(unroll=4, f16=1),
    (16384, 4096, 16): TC8Config(unroll=4, waves=8),
    (4096, 16384, 16): TC8Config(unroll=4, waves=8),
    (8704, 4096, 32): TC8Config(unroll=2),
    (32768, 4096, 32): TC8Config(unroll=4, stages=3),
}


def default_tc8_config(M: int, N: int = 0, K: int = 0) -> TC8Config:
    bm = tc_block_m(M)
    return TC8_SHAPE_DEFAULTS.get((N, K, bm)) or TC8_DEFAULTS[bm]


def _dequant8_asm(lo: str, hi: str, one: str, hi_bias: str) -> tl.constexpr:
    """PTX for one word -> the 16-bit pairs u − 128 of half8 0 and 1 (bytes (0, 2), then (1, 3))."""
    fma = "fma.rn.bf16x2" if lo == "0x43004300" else "fma.rn.f16x2"
    lines = ["{", ".reg .b32 t, l, h, one, hb;", f"mov.b32 one, {one};", f"mov.b32 hb, {hi_bias};"]
    for half8 in range(2):
        shift = 8 * half8
        if shift:
            lines.append(f"shr.u32 t, $2, {shift};")
        lines.append(f"lop3.b32 l, {'t' if shift else '$2'}, 0x000F000F, {lo}, 0xEA;")     # magic + l
        lines.append(f"shr.u32 t, $2, {shift + 4};")
        lines.append(f"lop3.b32 h, t, 0x000F000F, {hi}, 0xEA;")                          # magic' + 16h
        lines.append(f"{fma} h, h, one, hb;")              # 16h − 256 (bf16) / 16h − 1152 (fp16)
        lines.append(f"{fma} ${half8}, l, one, h;")        # + magic + l = u − 128
    return tl.constexpr("\n".join(lines + ["}"]))


DEQUANT_BF16_ASM = _dequant8_asm("0x43004300", "0x45004500", "0x3F803F80", "0xC510C510")   # −2304
DEQUANT_FP16_ASM = _dequant8_asm("0x64006400", "0x74007400", "0x3C003C00", "0xF448F448")   # −17536


@triton.jit
def _pair8(q, SHIFT: tl.constexpr, OFFSET: tl.constexpr, FP16: tl.constexpr):
    """Plain-Triton twin of one asm output: the 16-bit pair (byte + OFFSET) of the bytes at bits
    SHIFT and SHIFT + 16."""
    return _half_bits((q >> SHIFT) & 0xFF, OFFSET, FP16) | (_half_bits((q >> (SHIFT + 16)) & 0xFF, OFFSET, FP16) << 16)


@triton.jit
def _k_order8(r0, r1, BLOCK_N: tl.constexpr, FP16: tl.constexpr):
    """Registers of half8 0 and 1, [BN, 16 (t, c)] each -> the 16-bit tile [BN, 64] in k order
    (k = 16t + 8·half8 + 2c + pair)."""
    w = tl.reshape(_split_halves(tl.join(r0, r1)), (BLOCK_N, 16, 4))     # (t, c), (half8, pair)
    if FP16:
        w = w.to(tl.float16, bitcast=True)
    else:
        w = w.to(tl.bfloat16, bitcast=True)
    w = tl.reshape(w, (BLOCK_N, 4, 4, 2, 2))
    return tl.reshape(tl.permute(w, (0, 1, 3, 2, 4)), (BLOCK_N, 64))


@triton.jit
def _dequant8(q, BLOCK_N: tl.constexpr, USE_ASM: tl.constexpr, FP16: tl.constexpr):
    """Words [BN, 16] -> the weights u − 128 [BN, 64] in the activation dtype, k order."""
    if USE_ASM:
        ASM: tl.constexpr = DEQUANT_FP16_ASM if FP16 else DEQUANT_BF16_ASM
        r0, r1 = tl.inline_asm_elementwise(ASM, "=r,=r,r", [q], dtype=(tl.int32, tl.int32), is_pure=True, pack=1)
    else:
        r0 = _pair8(q, 0, -128.0, FP16)
        r1 = _pair8(q, 8, -128.0, FP16)
    return _k_order8(r0, r1, BLOCK_N, FP16)


@triton.jit
def _load8(x_ptr, qw_ptr, s_ptr, kb, kb1, pid_n, offs_n, offs_m, M, N, NG, stride_xm, GROUP: tl.constexpr,
           BLOCK_N: tl.constexpr, WARPS: tl.constexpr, EVEN_N: tl.constexpr):
    """Words, activations xᵀ [64, BM] and scales of 64-row block kb; everything masked (zero) for
    kb >= kb1 (unroll tails)."""
    q = _load_words(qw_ptr, kb, kb1, pid_n, NG, BLOCK_N, WARPS, EVEN_N)
    k = kb * 64 + tl.arange(0, 64)
    xt = tl.load(x_ptr + offs_m[None, :] * stride_xm + k[:, None],
                 mask=(offs_m < M)[None, :] & (k < kb1 * 64)[:, None], other=0.0)
    s = tl.load(s_ptr + ((kb * 64) // GROUP) * N + offs_n, mask=(offs_n < N) & (offs_n * 0 + kb < kb1),
                other=0.0).to(tl.float32)
    return q, xt, s


# the F16 variant's dequantization (module docstring): fp16 1024 + u pairs by PRMT, minus 1152
PRMT_FP16_ASM = tl.constexpr("{ .reg .b32 m, c; mov.b32 m, 0x64646464; mov.b32 c, 0x64806480;"
                             " prmt.b32 $0, $2, m, 0x4240; prmt.b32 $1, $2, m, 0x4341;"
                             " sub.f16x2 $0, $0, c; sub.f16x2 $1, $1, c; }")


@triton.jit
def _pow2_scale(xt):
    """Per column of xt [64, BM]: (2^e, 2^-e) with the column's largest |x|·2^e in [2^14, 2^15)."""
    amax = tl.max(tl.abs(xt.to(tl.float32)), axis=0)
    se = tl.minimum(tl.maximum(268 - ((amax.to(tl.int32, bitcast=True) >> 23) & 0xFF), 1), 253)
    return (se << 23).to(tl.float32, bitcast=True), ((254 - se) << 23).to(tl.float32, bitcast=True)


@triton.jit
def _mma8(acc, q, xt, s, BLOCK_N: tl.constexpr, USE_ASM: tl.constexpr, DOT_F32: tl.constexpr,
          F16: tl.constexpr = False):
    if F16:
        if USE_ASM:
            r0, r1 = tl.inline_asm_elementwise(PRMT_FP16_ASM, "=r,=r,r", [q], dtype=(tl.int32, tl.int32),
                                               is_pure=True, pack=1)
        else:
            r0 = _pair8(q, 0, -128.0, True)
            r1 = _pair8(q, 8, -128.0, True)
        w = _k_order8(r0, r1, BLOCK_N, True)
        if xt.dtype == tl.float16:
            x16 = xt
            back = s[:, None]
        else:
            up, down = _pow2_scale(xt)
            x16 = (xt.to(tl.float32) * up[None, :]).to(tl.float16)
            back = s[:, None] * down[None, :]
    else:
        w = _dequant8(q, BLOCK_N, USE_ASM, xt.dtype == tl.float16)
        x16 = xt
        back = s[:, None]
    if DOT_F32:
        part = tl.dot(w.to(tl.float32), x16.to(tl.float32))
    else:
        part = tl.dot(w, x16)
    return acc + part * back


@triton.jit
def _w8a16_tc_kernel(x_ptr, qw_ptr, s_ptr, y_ptr, ws_ptr, cnt_ptr, M, N, K, stride_xm, stride_ym, split_k,
                     GROUP: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_M: tl.constexpr, USE_ASM: tl.constexpr,
                     DOT_F32: tl.constexpr, WARPS: tl.constexpr, UNROLL: tl.constexpr, EVEN_N: tl.constexpr,
                     RED: tl.constexpr, F16: tl.constexpr = False, PDL: tl.constexpr = False):
    pdl_wait(PDL)
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    pid_m = tl.program_id(2)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    per = tl.cdiv(K // 64, split_k)
    kb0 = pid_k * per
    kb1 = tl.minimum(kb0 + per, K // 64)
    NG = N // 16
    acc = tl.zeros((BLOCK_N, BLOCK_M), tl.float32)
    for kb in range(kb0, kb1, UNROLL):
        # every load of the UNROLL blocks is issued before the first MMA
        q, xt, s = _load8(x_ptr, qw_ptr, s_ptr, kb, kb1, pid_n, offs_n, offs_m, M, N, NG, stride_xm, GROUP,
                          BLOCK_N, WARPS, EVEN_N)
        if UNROLL >= 2:
            q2, xt2, s2 = _load8(x_ptr, qw_ptr, s_ptr, kb + 1, kb1, pid_n, offs_n, offs_m, M, N, NG, stride_xm,
                                 GROUP, BLOCK_N, WARPS, EVEN_N)
        if UNROLL == 4:
            q3, xt3, s3 = _load8(x_ptr, qw_ptr, s_ptr, kb + 2, kb1, pid_n, offs_n, offs_m, M, N, NG, stride_xm,
                                 GROUP, BLOCK_N, WARPS, EVEN_N)
            q4, xt4, s4 = _load8(x_ptr, qw_ptr, s_ptr, kb + 3, kb1, pid_n, offs_n, offs_m, M, N, NG, stride_xm,
                                 GROUP, BLOCK_N, WARPS, EVEN_N)
        acc = _mma8(acc, q, xt, s, BLOCK_N, USE_ASM, DOT_F32, F16)
        if UNROLL >= 2:
            acc = _mma8(acc, q2, xt2, s2, BLOCK_N, USE_ASM, DOT_F32, F16)
        if UNROLL == 4:
            acc = _mma8(acc, q3, xt3, s3, BLOCK_N, USE_ASM, DOT_F32, F16)
            acc = _mma8(acc, q4, xt4, s4, BLOCK_N, USE_ASM, DOT_F32, F16)
    store_split_k(acc, y_ptr, ws_ptr, cnt_ptr, pid_m * tl.num_programs(0) + pid_n, pid_k, split_k, offs_m, offs_n,
                  (offs_m < M)[None, :] & (offs_n < N)[:, None], M, N, stride_ym, RED)


@triton.jit
def _w8a16_tc_dequant_kernel(qw_ptr, s_ptr, w_ptr, N, K, GROUP: tl.constexpr, BLOCK_N: tl.constexpr,
                             USE_ASM: tl.constexpr, WARPS: tl.constexpr):
    """W [N, K] in w's dtype from the tensor-core layout (more than MAX_ROWS rows: cuBLAS on it)."""
    FP16: tl.constexpr = w_ptr.dtype.element_ty == tl.float16
    kb = tl.program_id(0)
    pid_n = tl.program_id(1)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    q = _load_words(qw_ptr, kb, kb + 1, pid_n, N // 16, BLOCK_N, WARPS, False)
    w = _dequant8(q, BLOCK_N, USE_ASM, FP16)
    s = tl.load(s_ptr + ((kb * 64) // GROUP) * N + offs_n, mask=offs_n < N, other=0.0).to(tl.float32)
    k = kb * 64 + tl.arange(0, 64)
    w = (w.to(tl.float32) * s[:, None]).to(w_ptr.dtype.element_ty)
    tl.store(w_ptr + offs_n[:, None].to(tl.int64) * K + k[None, :], w,
             mask=(offs_n < N)[:, None])


def _unroll(unroll: int, blocks: int) -> int:
    """The kernel's UNROLL (1, 2 or 4): at most `unroll` and at most the blocks one split owns."""
    return next(u for u in (4, 2, 1) if u <= unroll and u <= blocks)


def w8a16_tc(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor, group_size: int,
             config: TC8Config | None = None, sms: int = 132, use_asm: bool | None = None) -> torch.Tensor:
    """x [M, K] bf16/fp16 (M <= MAX_ROWS) · Wᵀ -> [M, N] in x's dtype. qweight int32 [K/64, N/16, 256]
    (layout.py `pack_tc8`), scales fp16 [groups, N]; group_size -1 means one group over K."""
    M, K = x.shape
    N = qweight.shape[1] * TC_ROWS
    assert qweight.shape[0] * K_BLOCK8 == K and qweight.shape[2] == 256, \
        "qweight must be pack_tc8(u) of a [K, N] weight"
    assert x.dtype in (torch.bfloat16, torch.float16) and 1 <= M <= MAX_ROWS and tc8_fits(K, N, group_size)
    if x.stride(-1) != 1:
        x = x.contiguous()
    cfg = config or default_tc8_config(M, N, K)
    bn = cfg.block_n
    while bn > 16 and N < bn:
        bn //= 2
    cfg = replace(cfg, block_n=bn)
    split = cfg.split(M, N, K, sms)
    y = torch.empty(M, N, device=x.device, dtype=x.dtype)
    ws = torch.empty(split if split > 1 else 1, M, N, device=x.device, dtype=torch.float32)
    grid = (triton.cdiv(N, bn), split, triton.cdiv(M, tc_block_m(M)))
    cnt = split_counters(x.device, grid[0] * grid[2])
    _w8a16_tc_kernel[grid](
        x, qweight, scales, y, ws, cnt, M, N, K, x.stride(0), y.stride(0), split,
        GROUP=K if group_size == -1 else group_size, BLOCK_N=bn, BLOCK_M=tc_block_m(M),
        USE_ASM=(not _INTERPRET) if use_asm is None else use_asm, DOT_F32=_INTERPRET, WARPS=cfg.warps,
        UNROLL=_unroll(cfg.unroll, triton.cdiv(K // K_BLOCK8, split)),
        EVEN_N=N % bn == 0, RED=cfg.red, F16=bool(cfg.f16), num_warps=cfg.warps, num_stages=cfg.stages,
        **launch_args(x.device))
    return y


def w8a16_tc_dequantize(qweight: torch.Tensor, scales: torch.Tensor, group_size: int,
                        dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """The dequantized W [N, K] (then `F.linear(x, W)` is the plain cuBLAS call)."""
    K, N = qweight.shape[0] * K_BLOCK8, qweight.shape[1] * TC_ROWS
    w = torch.empty(N, K, device=qweight.device, dtype=dtype)
    bn = 64 if N % 64 == 0 else 16
    _w8a16_tc_dequant_kernel[(K // K_BLOCK8, triton.cdiv(N, bn))](
        qweight, scales, w, N, K, GROUP=K if group_size == -1 else group_size, BLOCK_N=bn,
        USE_ASM=not _INTERPRET, WARPS=4, num_warps=4)
    return w

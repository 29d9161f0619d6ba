"""How the split-K paged decode attention (triton.py) is launched: the launch config
(DecodeConfig: warps, stages, programs per SM, splits, page-id preload), the defaults per KV page
dtype and row count, the configs the benchmark sweeps, and the split count. Set from
benchmarks/decode_attention_bench.py on the H200; the comments keep the measurements. No triton
import: CPU-only installs can read and test the launch rules."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from salactl.runtime.ops.decode_attention.reference import is_fp8


def _next_power_of_2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


@dataclass(frozen=True)
class DecodeConfig:
    """Launch policy of paged_attention: splits = min(max_splits, programs_per_sm * SMs / rows,
    blocks)."""
    warps: int = 4
    stages: int = 3
    programs_per_sm: int = 4
    max_splits: int = 128
    maxnreg: int | None = None  # register cap per thread (more CTAs per SM, maybe spills)
    # > 0: each program preloads the page ids of its split, at most this many (a power of 2) at a
    # time, so `stages - 1` pages' K/V are in flight per program (0: one page, after the math)
    preload: int = 0
    sub: int = 0           # tokens per online-softmax step (a power-of-2 divisor of the page; 0: the page)
    early: bool = False    # load slots and seq_lens before the PDL wait (see _split_kernel)
    tma: bool = False      # K/V pages by Hopper TMA copies (one per page and operand; whole pages)

    def __post_init__(self):
        # tl.arange spans (sub tokens, preload page ids) are powers of 2; sub is tl.dot's K (>= 16)
        if self.sub and (self.sub < 16 or self.sub & (self.sub - 1)):
            raise ValueError(f"DecodeConfig: sub {self.sub} must be 0 (whole pages) or a power of two >= 16 "
                             "dividing the page size")
        if self.preload < 0 or self.preload & (self.preload - 1):
            raise ValueError(f"DecodeConfig: preload {self.preload} must be 0 (off) or a power of two")
        if self.tma and self.sub:
            raise ValueError("DecodeConfig: TMA pages are whole pages per softmax step; set sub=0 or tma=False")

    @property
    def name(self) -> str:
        reg = f" r{self.maxnreg}" if self.maxnreg else ""
        pre = f" pre{self.preload}" if self.preload else ""
        sub = f" sub{self.sub}" if self.sub else ""
        early = (" early" if self.early else "") + (" tma" if self.tma else "")
        return (f"page w{self.warps} s{self.stages}{reg}{pre}{sub}{early} pps{self.programs_per_sm} "
                f"max{self.max_splits}")

    def max_pages(self, max_blocks: int, num_splits: int) -> int:
        """The split kernel's MAXP: 0 (no preload) or the power of 2 >= the longest split (pages
        ceil(max_blocks / num_splits)), capped by `preload` (longer splits preload in chunks)."""
        if not self.preload:
            return 0
        return max(2, min(self.preload, _next_power_of_2(math.ceil(max_blocks / max(num_splits, 1)))))

    def launch(self) -> dict:
        kw = dict(num_warps=self.warps, num_stages=self.stages)
        if self.maxnreg:
            kw["maxnreg"] = self.maxnreg
        return kw


# The defaults per KV page dtype ("bf16" also covers fp16 pages; "fp8" both FP8 formats; fp32
# pages: tests and reference runs only). Edit "bf16"/"fp8" from the table of benchmarks/decode_attention_bench.py: the
# fastest config per dtype at 128K b1 that is no slower (x default >= ~0.98) on the other cases.
DEFAULT_CONFIGS = {
    # 2 warps, 4 programs per SM, early loads, pages by TMA: each no slower than the one before on every
    # case; page-id preload loses for bf16 at b8/b32 (BENCHMARKS.md, GPU engine sessions 4, 8, 19).
    "bf16": DecodeConfig(warps=2, programs_per_sm=4, max_splits=256, early=True, tma=True),
    # 2 warps, page ids preloaded (two pages in flight per program), early loads: faster on every case
    # but sparse 128K (BENCHMARKS.md, GPU engine sessions 4, 8); 8-32 rows take "fp8_mid".
    "fp8": DecodeConfig(warps=2, stages=3, programs_per_sm=4, max_splits=256, preload=16, early=True),
    # FP8 pages at 8-32 rows (FP8_MID_ROWS): the bf16 config without preload beat the preload over
    # 4K-512K contexts, which stays ahead at 2-4 and 64-128 rows (BENCHMARKS.md, W4A16 and FP8 KV session 12).
    # choose_splits rounds down: 540 programs at 128K b10 instead of 528 were 1.5x slower.
    "fp8_mid": DecodeConfig(warps=2, programs_per_sm=4, max_splits=256, early=True),
    "fp32": DecodeConfig(),
}
FP8_MID_ROWS = (8, 32)

# What benchmarks/decode_attention_bench.py times besides the defaults (and the GPU test checks).
# The split count is a runtime argument: rows differing only in programs_per_sm/max_splits share a
# compile. Offline sm_90 compiles (Triton 3.9, fp8 / bf16 regs per thread -> CTAs per SM by
# registers): w4 146/96 (3/5); w4 r128 fp8 4 CTAs with 6 spilled words; w2 201/134 (5/7, no
# spills; smem 22/39 KB per CTA).
# A page's loads are issued after the previous page's math (one buffer): the bytes in flight per
# SM are CTAs/SM x bytes per iteration, which is what fp8 (half the bytes per page) lacks.
SWEEP_CONFIGS = (
    DecodeConfig(),
    DecodeConfig(programs_per_sm=8, max_splits=256),
    DecodeConfig(maxnreg=128, programs_per_sm=3, max_splits=256),
    DecodeConfig(maxnreg=128, programs_per_sm=4, max_splits=256),
    DecodeConfig(warps=2, programs_per_sm=4, max_splits=256),
    DecodeConfig(warps=2, programs_per_sm=5, max_splits=512),
    # page ids preloaded: `stages - 1` pages in flight per program (offline registers and shared memory
    # per CTA: BENCHMARKS.md, "Tuning notes moved from code comments")
    DecodeConfig(warps=2, stages=3, programs_per_sm=4, max_splits=256, preload=16),
    DecodeConfig(warps=2, stages=4, programs_per_sm=4, max_splits=256, preload=16),
    DecodeConfig(warps=2, stages=4, programs_per_sm=2, max_splits=256, preload=16),
    DecodeConfig(warps=4, stages=4, programs_per_sm=3, max_splits=256, preload=16),
    DecodeConfig(warps=4, stages=3, programs_per_sm=4, preload=16),
    # more programs per SM for fp8 (w2 s3 fits 5 CTAs/SM by smem; w1 more by regs); one warp per
    # program (no P exchange across warps) was slower for both dtypes at 128K b1 (BENCHMARKS.md,
    # W4A16 and FP8 KV session 13)
    DecodeConfig(warps=2, stages=3, programs_per_sm=5, max_splits=512, preload=16),
    DecodeConfig(warps=1, stages=3, programs_per_sm=8, max_splits=512, preload=16),
    DecodeConfig(warps=1, stages=4, programs_per_sm=6, max_splits=512, preload=16),
    # capping registers for 5-8 CTAs per SM (the fp8 default's registers allow 4) lost for both dtypes
    # at 128K; with token-minor FP8 V shared memory, not registers, limits CTAs per SM (5 / 8 at 3 / 2
    # stages) (BENCHMARKS.md, W4A16 and FP8 KV sessions 5, 7)
    DecodeConfig(warps=2, stages=2, programs_per_sm=8, max_splits=512, preload=16),
    DecodeConfig(warps=4, stages=3, programs_per_sm=5, max_splits=512, preload=16),
    DecodeConfig(warps=2, stages=3, programs_per_sm=6, max_splits=512, preload=16),
    # fewer, longer splits than the default (396 / 384 programs at 128K b1 instead of 512): slower for
    # fp8 at 128K (BENCHMARKS.md, f0a77c8)
    DecodeConfig(warps=2, stages=3, programs_per_sm=3, max_splits=256, preload=16),
    DecodeConfig(warps=2, stages=3, programs_per_sm=4, max_splits=192, preload=16),
    DecodeConfig(warps=2, stages=4, programs_per_sm=3, max_splits=256, preload=16),
    # half a page per softmax step (half the shared memory per stage): slower at 128K b1 for both
    # dtypes, faster only for bf16 at 4K b8 (BENCHMARKS.md, GPU engine session 8)
    DecodeConfig(warps=2, stages=3, programs_per_sm=4, max_splits=256, preload=16, sub=32),
    DecodeConfig(warps=2, programs_per_sm=4, max_splits=256, sub=32),
    # the defaults without early loads (slots / seq_lens loaded after the PDL wait)
    DecodeConfig(warps=2, programs_per_sm=4, max_splits=256),
    DecodeConfig(warps=2, stages=3, programs_per_sm=4, max_splits=256, preload=16),
    # pages by TMA (one bulk copy per page and operand instead of 16-byte cp.async); the first is the
    # bf16 default with cp.async pages (tma off)
    DecodeConfig(warps=2, programs_per_sm=4, max_splits=256, early=True),
    DecodeConfig(warps=2, stages=3, programs_per_sm=4, max_splits=256, preload=16, early=True, tma=True),
    DecodeConfig(warps=2, stages=4, programs_per_sm=4, max_splits=256, preload=16, early=True, tma=True),
    DecodeConfig(warps=2, stages=3, programs_per_sm=5, max_splits=512, preload=16, early=True, tma=True),
    DecodeConfig(warps=4, stages=3, programs_per_sm=4, max_splits=256, preload=16, early=True, tma=True),
    DecodeConfig(warps=2, stages=2, programs_per_sm=6, max_splits=512, preload=16, early=True, tma=True),
)


def default_config(kv_dtype=None, rows: int | None = None) -> DecodeConfig:
    """The launch config for a KV page dtype and (FP8 only) the row count (batch x KV heads)."""
    if is_fp8(kv_dtype):
        mid = rows is not None and FP8_MID_ROWS[0] <= rows <= FP8_MID_ROWS[1]
        return DEFAULT_CONFIGS["fp8_mid" if mid else "fp8"]
    return DEFAULT_CONFIGS["fp32" if kv_dtype == torch.float32 else "bf16"]


def choose_splits(rows: int, max_blocks: int, sms: int = 132, kv_dtype=None,
                  config: DecodeConfig | None = None) -> int:
    """Enough programs for `programs_per_sm` per SM (memory parallelism) and never more (rows x
    splits <= programs_per_sm x sms), never more splits than blocks (the config: `config`, else the
    default for the KV dtype)."""
    c = config or default_config(kv_dtype, rows)
    return max(1, min(c.max_splits, c.programs_per_sm * sms // max(rows, 1), max_blocks))

"""Launch knobs of the decode selection (gpu.select_decode): tiles, warps and which top-k path a
row takes. They change its speed, never its result."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass


# The defaults are tuned with benchmarks/sparse_decode_bench.py's sweep.
# Why these values (H200; the runs, commands and commits: BENCHMARKS.md, GPU engine sessions 3-35):
# - the rank top-k (rb32 ct256 w8) beat the grid threshold select at 1M and at 128K up to 4 short
#   rows; larger batches of short rows keep the one-program radix select.
# - dedup: one histogram atomic per distinct bin of a program, since a row's blocks crowd into a
#   few of the 4096 bins and per-block atomics serialise on them.
# - pass 2: 32 blocks per program on 4 warps, p2_early (its K1 scores before the PDL wait, so its
#   programs overlap the lse pass).
# - the lse pass: 128 windows per step, 2 stages, one online softmax per (head, window slot).
# - short_blocks 4096: 128K rows gathered before their rank were slower.
# Designs measured slower and not kept: BENCHMARKS.md, "Tuning notes moved from code comments".
@dataclass(frozen=True)
class SelectionTuning:
    """Pass 1 (lse) and pass 2 (int32 score words + the row's top-12-bit histogram) of
    triton_decode.py, then the top-k (triton_rank.topk_launch): rows longer than `short_blocks`
    blocks are gathered down to the histogram's threshold bin, then ranked; shorter rows are
    ranked the same way when the batch has at most `rank_short_rows` rows, else take the
    one-program radix select (triton_radix.py)."""

    nbc: int = 32                # pass 2: blocks per program (a power of 2)
    num_warps: int = 4           # pass 2: warps
    # pass 1: programs per row. None: about four per SM, at most 256, plus the compress split of
    # the fused K1 update where that keeps pass 2's merge tile; given: the compress split
    # included, so at least 2
    lse_splits: int | None = None
    dedup: bool = True           # pass 2: one histogram atomic per distinct bin, not per block
    p2_early: bool = True        # pass 2: its K1 scores before the PDL wait (overlaps pass 1)
    lse_bw: int = 128            # pass 1: windows per step (a power of 2)
    lse_elem: bool = True        # pass 1: an online softmax per (head, window slot), not per row
    lse_warps: int = 4           # pass 1: warps
    lse_stages: int = 2          # pass 1: pipeline stages
    short_blocks: int = 4096     # top-k: rows of at most this many blocks skip the gather
    gather_chunk: int = 1024     # top-k: blocks per program of the gather of long rows
    rank_rb: int = 32            # rank top-k: keys per program and step
    rank_ct: int = 256           # rank top-k: width of the tiles those keys are compared with
    rank_warps: int = 8          # rank top-k: warps
    rank_short_rows: int = 4     # short rows are ranked in batches up to this many rows
    radix_warps: int = 8         # radix top-k (short rows of larger batches): warps

    def with_knobs(self, **knobs) -> SelectionTuning:
        """This tuning with the named knobs replaced; an unknown name is a TypeError."""
        unknown = set(knobs) - set(knob_names())
        if unknown:
            raise TypeError(f"unknown selection knobs {sorted(unknown)}; "
                            f"valid: {sorted(knob_names())}")
        return dataclasses.replace(self, **knobs)


def knob_names() -> list[str]:
    """SelectionTuning's knobs in declaration order."""
    return [f.name for f in dataclasses.fields(SelectionTuning)]

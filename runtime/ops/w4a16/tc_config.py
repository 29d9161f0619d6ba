"""How the W4A16 tensor-core kernels (triton_tc.py, triton_tma.py) are launched: the config of one
launch (TCConfig), the text specs that describe configs (`benchmarks/w4a16_bench.py --configs` takes
the same text), and the dispatch tables that pick one per shape and row count, set from H200
sweeps whose history the comments keep. No triton import: CPU-only installs can read and test the
launch policy."""

from __future__ import annotations

from dataclasses import dataclass

from salactl.runtime.ops.w4a16.layout import K_BLOCK


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


@dataclass(frozen=True)
class TCConfig:
    block_n: int = 64
    block_m: int = 16
    split_k: int = 1
    num_warps: int = 4
    num_stages: int = 1
    bias_dot: bool = True
    unroll: int = 1
    prefetch: int = 0        # 1: register software pipeline
    reduce: int = 1          # split-K partials summed RED at a time by the last split (1: one by one)
    tma: int = 0             # 1: words by TMA in a num_stages-deep shared-memory pipeline (triton_tma.py);
                             # 2: the activations by TMA too
    tma_blocks: int = 1      # with tma: 128-row blocks per TMA copy (1 or 2)
    early: int = 0           # E > 0: an L2 prefetch of the words of the first E unroll groups (TMA: E
                             # times the pipeline's first stages) before the PDL wait; -1: all the split's

    def prefetch_blocks(self, split_blocks: int) -> int:
        """128-row blocks whose words the kernel prefetches into L2 before its PDL wait (0: none),
        at most the `split_blocks` one split owns."""
        if not self.early:
            return 0
        if self.early < 0:
            return split_blocks
        if self.tma:
            group = max(self.num_stages - 1, 1) * self.tma_blocks
        else:
            group = self.unroll * (2 if self.prefetch else 1)
        return min(int(self.early) * group, split_blocks)


def tc_block_m(M: int) -> int:
    return 16 if M <= 16 else 32 if M <= 32 else 64


# The dispatch defaults, as config specs (the same text `benchmarks/w4a16_bench.py --configs` takes
# and its table prints per shape and M): edit them from that benchmark's results.
#   bn/w: BLOCK_N and warps; bias: 1 = bias MMA, 0 = fma dequant; un: blocks per loop step (cut to the
#   blocks one split has); pf: 1 = the next step's loads are issued before this step's MMAs (software
#   pipeline); stages: Triton cp.async stages; waves: split K until about waves x SMs CTAs exist
#   (rounded; fit=1 rounds down, so that a grid sized to the CTAs an SM holds has no straggler
#   wave, e.g. 8704x4096: 136 tiles x split 3 = 408 CTAs, not x 4 = 544 > 4 x 132; split=S fixes
#   the split); red: split-K partials the last split sums per load; tma: 1 = words and scales by
#   Hopper TMA in a `stages`-deep mbarrier pipeline (triton_tma.py), 2 = activations too; tkb: 128-row
#   blocks per TMA copy (2 needs K/128 even, else 1); ew: E > 0 = an L2 prefetch before the PDL wait of
#   the words of the first E unroll groups (E x 2 with pf=1), or E times the TMA pipeline's first
#   stages (the register kernel's words *loaded* before the wait needed a peeled first step: slower);
#   ew=-1: all of the split's words. More than ew=1 is slower, alone and in the engine: a prefetch of
#   every block reaches DRAM ahead of the loop's own loads in no useful order (BENCHMARKS.md, W4A16
#   sessions 10-11).
# Keyed by BLOCK_M (16 for M <= 16, 32, 64); TC_SHAPE_DEFAULTS[(N, K, BLOCK_M)] overrides one shape,
# and TC_SHAPE_DEFAULTS[(N, K, 1)] overrides it for exactly one row (batch-1 decode), checked first.
TC_DEFAULTS: dict[int, str] = {
    16: "bn=64,w=4,bias=0,un=4,pf=0,stages=1,waves=4,red=1,ew=1",
    32: "bn=64,w=4,bias=0,un=1,pf=0,stages=3,waves=4,red=4",
    64: "bn=64,w=4,bias=0,un=1,pf=0,stages=3,waves=4,red=1",
}
# At 1-16 rows the TMA pipeline won every fused projection but o_proj 4096x4096; tkb=2 helps down and
# gate+up only, ew=1 qkvz and the sparse projection only; red sums every split at once since
# split_k.py's RED > 1 sum was fixed. Shapes never swept keep the register kernel (BENCHMARKS.md,
# W4A16 sessions 6-15).
TC_SHAPE_DEFAULTS: dict[tuple[int, int, int], str] = {
    (16384, 4096, 16): "bn=128,w=4,tma=1,stages=4,waves=4,ew=1,red=4",
    (4096, 16384, 16): "bn=128,w=4,tma=1,tkb=2,stages=4,waves=2,red=8",
    (8704, 4096, 16): "bn=64,w=4,tma=1,tkb=2,stages=3,waves=4,ew=1,red=4",
    (32768, 4096, 16): "bn=128,w=4,tma=1,tkb=2,stages=4,waves=2",
    # o_proj 4096x4096: at 2-16 rows the bias-MMA dequantization (an unroll-2 fma was faster alone at
    # 8 rows but slowed the b8 engine step); at one row the fma with the L2 prefetch (ew=1)
    # (BENCHMARKS.md, W4A16 sessions 9-10)
    (4096, 4096, 1): "bn=64,w=4,bias=0,un=4,pf=0,stages=1,waves=4,ew=1,red=8",
    (4096, 4096, 16): "bn=64,w=4,bias=1,un=4,pf=0,stages=1,waves=4,red=8",
    # 32 rows: o_proj unroll 2 without stages, the L2 prefetch of two groups (ew=2) and every split summed
    # at once (the only spec past 1.5x bf16; every TMA spec lost); the sparse projection keeps no red;
    # gate+up takes TMA pairs (BENCHMARKS.md, W4A16 sessions 9, 13 and 15).
    (4096, 4096, 32): "bn=64,w=4,bias=0,un=2,pf=0,stages=1,waves=4,ew=2,red=8",
    (8704, 4096, 32): "bn=64,w=4,bias=0,un=1,pf=0,stages=3,waves=4",
    (32768, 4096, 32): "bn=64,w=4,tma=1,tkb=2,stages=3,waves=4",
}

_SPEC_KEYS = {"bn": 64, "w": 4, "bias": 0, "un": 1, "pf": 0, "stages": 1, "waves": 4.0, "fit": 0, "split": 0,
              "red": 1, "tma": 0, "tkb": 1, "ew": 0}


def parse_tc_spec(text: str) -> dict:
    """'bn=64,w=4,un=4,pf=1,...' -> every spec field (missing ones at their defaults)."""
    spec = dict(_SPEC_KEYS)
    for part in filter(None, (p.strip() for p in text.split(","))):
        key, _, val = part.partition("=")
        if key not in spec or not val:
            raise ValueError(f"bad W4A16 config field {part!r}; fields: {', '.join(_SPEC_KEYS)}")
        spec[key] = float(val) if key == "waves" else int(val)
    return spec


# The TMA variant needs BLOCK_N >= 64: on the H200 (Triton 3.6) BLOCK_N 16 (a 32-byte scale box) faulted
# with a misaligned address; 64 and 128 are the measured ones. Narrower tiles use the register kernel.
TMA_MIN_BLOCK_N = 64


def tc_config_from_spec(spec: dict | str, M: int, N: int, K: int, sms: int = 132) -> TCConfig:
    """The TCConfig a spec gives for an [M, K] x [K, N] call (split from waves, unroll cut to the
    blocks per split, BLOCK_N halved down to 16 for narrow N)."""
    if isinstance(spec, str):
        spec = parse_tc_spec(spec)
    bm = tc_block_m(M)
    bn = spec["bn"]
    while bn > 16 and N < bn:
        bn //= 2
    tiles = _cdiv(N, bn) * _cdiv(M, bm)
    nkb = K // K_BLOCK
    ctas = spec["waves"] * sms / tiles
    split = max(1, min(nkb, spec["split"] or (int(ctas) if spec["fit"] else round(ctas))))
    per_split = _cdiv(nkb, split)
    unroll = min(spec["un"], 4 if per_split >= 4 else 2 if per_split >= 2 else 1)
    if spec["tma"] and bn >= TMA_MIN_BLOCK_N:   # the TMA loop pipelines through smem: no unroll / prefetch
        tkb = spec["tkb"] if nkb % spec["tkb"] == 0 else 1
        return TCConfig(bn, bm, split, spec["w"], spec["stages"], bool(spec["bias"]), 1, 0, spec["red"], spec["tma"],
                        tkb, spec["ew"])
    return TCConfig(bn, bm, split, spec["w"], spec["stages"], bool(spec["bias"]), unroll, spec["pf"],
                    spec["red"], early=spec["ew"])


def default_tc_config(M: int, N: int, K: int, sms: int = 132) -> TCConfig:
    """The dispatch's choice: TC_SHAPE_DEFAULTS / TC_DEFAULTS. History of the table (H200 sweep,
    benchmarks/w4a16_bench.py --quick, torch 2.11, triton 3.6, 9B shapes, GPTQ g128; µs, best
    variant vs the previous default bn64 fma un1 st3):

    - BLOCK_N 64, 4 warps, fma dequant, split K until about `waves` = 4 CTAs per SM exist: every
      winner (qkv/o/z 4096x4096 and down 4096x16384 split 8, gate/up 16384x4096 split 2, k/v
      256x4096 split 32, i.e. one 128-row block per split).
    - BLOCK_M 16 (M <= 16; the kernel does the same work for any M up to 16): no cp.async stages,
      and the loads of up to 4 blocks in flight before the first MMA (unroll = 4, or fewer when a
      split has fewer blocks, so k/v runs unroll 1): qkv M=1 7.38 (un2) vs 8.28, M=8 7.79 (un4)
      vs 8.31; gate/up M=1 15.72 vs 17.05, M=8 16.36 vs 17.48; down M=1 16.32 vs 18.32, M=8
      16.77 vs 17.98 (all un4); k/v M=1 5.91 vs 6.28, M=8 6.43 vs 6.70 (un1 st1).
    - BLOCK_M 32/64: 3 cp.async stages, unroll 1 (won for gate/up, down and k/v at M=32; qkv's
      10.48 with un2 st1 vs 10.78 is within 3%).
    - Session 6: at BLOCK_M 16 the engine's fused projections except 4096x4096 use the TMA
      pipeline (TC_SHAPE_DEFAULTS); every other shape keeps the register kernel.
    - Session 9: o_proj at 2-16 rows the bias MMA, M = 1 the fma (TC_SHAPE_DEFAULTS).
    - Session 15: BLOCK_M 32 is the 3-stage unroll-1 kernel with every 4 split partials summed at
      once (red=4); o_proj at 32 rows unroll 2 without stages, ew=2, red=8 (TC_SHAPE_DEFAULTS).
    """
    bm = tc_block_m(M)
    spec = (M == 1 and TC_SHAPE_DEFAULTS.get((N, K, 1))) or TC_SHAPE_DEFAULTS.get((N, K, bm)) or TC_DEFAULTS[bm]
    return tc_config_from_spec(spec, M, N, K, sms)


def glu_epilogue_ok(cfg: TCConfig, N: int, K: int, group_size: int) -> bool:
    """Whether a launch of `cfg` over a [gate | up] weight with N rows in all can store silu(gate)·up
    itself (triton_tma.py GLU): the TMA kernel only (its 4-D word box takes each tile's gate and up
    row groups), groups of >= 128 rows (smaller groups scale the weights by row index before the
    MMA), and whole tiles (N/2 a multiple of BLOCK_N/2, so a tile's halves are row groups of each)."""
    group = K if group_size == -1 else group_size
    return (bool(cfg.tma) and cfg.block_n >= TMA_MIN_BLOCK_N and group % 128 == 0
            and N % cfg.block_n == 0)


def launch_split(cfg: TCConfig, K: int) -> int:
    """The split-K factor a launch uses: cfg.split_k, at most one 128-row block per split."""
    return max(1, min(cfg.split_k, K // K_BLOCK))


def split_blocks(K: int, split: int, kbp: int = 1) -> int:
    """128-row blocks one split owns (the kernels' `_tile_setup`: whole groups of `kbp` blocks)."""
    return _cdiv(_cdiv(K // K_BLOCK, split), kbp) * kbp

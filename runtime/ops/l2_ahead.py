"""A decode projection's W4A16 weights fetched into L2 while the small kernels before it run.

In a W4A16 decode step DRAM idles between projections: the kernels that are not projections (norms,
RoPE, the GLA update, attention, gates) took 420 us of the 2.5 ms batch-1 step and read almost no
DRAM (BENCHMARKS.md, GPU engine session 13), and each projection starts its own weight stream from
cold. `ahead(module, fraction)` forks a side stream off the current one at the point of call (so
it starts once every kernel launched so far has finished) and launches there one kernel of
`cp.async.bulk.prefetch.L2` instructions over the first `fraction` of each split-K range of the
module's packed words and scales: in the `pack_tc` layout (K blocks outermost) that is what the
projection's CTAs read first. The main stream waits for the side stream only at `join()`, the end
of the forward. A prefetch is a hint that returns no data, so results are bit for bit the same
whether, when or how far it runs; stream capture records the fork and join into the CUDA graph.

Hand-written: no library exposes Hopper's bulk L2 prefetch (one instruction per 16 KB piece here).

SALACTL_L2_AHEAD="o=1,gu=0.125,qkv=0.125,down=0" sets the fraction per projection kind (o_proj,
the MLP's gate/up, the attention input projection, the MLP's down projection; "+" also separates
entries); unset or "0": off.
Only CUDA devices of sm_90+, outside the Triton interpreter, at decode row counts.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from salactl.runtime.ops.pdl import is_sm90
from salactl.runtime.ops.w4a16.layout import K_BLOCK
from salactl.runtime.ops.w4a16.tc_config import default_tc_config, launch_split, split_blocks

KINDS = ("o", "gu", "qkv", "down")
PIECE = 16 << 10            # bytes per prefetch instruction
BLOCK = 128                 # instructions per program
MAX_ROWS = 64               # decode row counts (above: prefill, dequantize + cuBLAS)

_SIDE: dict[int, torch.cuda.Stream] = {}
_FORKED: set[int] = set()


@triton.jit
def _prefetch_kernel(base_ptr, chunk_stride, take, pieces_per_chunk, pieces, PIECE: tl.constexpr,
                     BLOCK: tl.constexpr):
    """Piece i = (chunk i // pieces_per_chunk, j = i % pieces_per_chunk): bytes [j·PIECE, min(take,
    (j+1)·PIECE)) of chunk `chunk`, which starts at chunk·chunk_stride bytes from base_ptr."""
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    chunk, j = i // pieces_per_chunk, i % pieces_per_chunk
    size = tl.minimum(take - j * PIECE, PIECE)
    live = (i < pieces) & (size > 0)
    ptrs = base_ptr + chunk.to(tl.int64) * chunk_stride + j.to(tl.int64) * PIECE
    tl.inline_asm_elementwise(
        "{ .reg .pred p; setp.ne.b32 p, $3, 0; @p cp.async.bulk.prefetch.L2.global [$1], $2; mov.u32 $0, 0; }",
        "=r,l,r,r", [ptrs, size, live.to(tl.int32)], dtype=tl.int32, is_pure=False, pack=1)


def fractions() -> dict[str, float]:
    """SALACTL_L2_AHEAD parsed: {kind: fraction in [0, 1]} (empty: off)."""
    text = os.environ.get("SALACTL_L2_AHEAD", "").strip()
    if text in ("", "0"):
        return {}
    out = {}
    for part in text.replace("+", ",").split(","):
        kind, _, value = part.partition("=")
        if kind not in KINDS or not value:
            raise ValueError(f"SALACTL_L2_AHEAD: bad entry {part!r}; want e.g. o=1,gu=0.125,qkv=0.125,down=0")
        out[kind] = min(1.0, max(0.0, float(value)))
    return {k: v for k, v in out.items() if v > 0}


def prefetch_chunks(t: torch.Tensor, chunks: int, take_fraction: float) -> None:
    """Launch the bulk L2 prefetch of the first `take_fraction` of each of `chunks` equal ranges of
    the contiguous tensor t (on the current stream)."""
    nbytes = t.numel() * t.element_size()
    stride = nbytes // chunks
    take = (int(stride * take_fraction) + 15) // 16 * 16
    if take <= 0:
        return
    take = min(take, stride // 16 * 16)
    per_chunk = triton.cdiv(take, PIECE)
    pieces = per_chunk * chunks
    _prefetch_kernel[(triton.cdiv(pieces, BLOCK),)](t.view(torch.uint8), stride, take, per_chunk, pieces,
                                                    PIECE=PIECE, BLOCK=BLOCK, num_warps=4)


def _w4a16(module):
    from salactl.quant.linear import W4A16Linear

    module = getattr(module, "module", module)          # fast_model._Unregistered
    return module if type(module) is W4A16Linear and module.layout == "triton" else None


def ahead(module, kind: str, rows: int, device: torch.device) -> None:
    """Fork the L2 prefetch of `module`'s first weights for the projection of `kind` (see the
    module docstring); a no-op unless SALACTL_L2_AHEAD sets that kind and this is a decode-sized
    call of a Triton-layout W4A16 module on an sm_90+ GPU."""
    frac = fractions().get(kind, 0.0)
    mod = _w4a16(module) if frac > 0 else None
    if (mod is None or rows > MAX_ROWS or device.type != "cuda" or os.environ.get("TRITON_INTERPRET") == "1"
            or not is_sm90(device)):
        return
    from salactl.runtime.ops.w4a16.triton import sm_count

    K, N = mod.in_features, mod.out_features
    cfg = default_tc_config(rows, N, K, sm_count(device))
    split = launch_split(cfg, K)
    kbs = split_blocks(K, split, cfg.tma_blocks if cfg.tma else 1)
    nkb = K // K_BLOCK
    chunks = triton.cdiv(nkb, kbs)
    # a split's range is kbs blocks (the last one shorter); prefetching by equal ranges of nkb /
    # chunks blocks is exact when chunks divides nkb, which holds for the 9B's shapes
    take = frac if nkb % chunks == 0 else min(1.0, frac * kbs * chunks / nkb)
    idx = device.index if device.index is not None else torch.cuda.current_device()
    side = _SIDE.setdefault(idx, torch.cuda.Stream(device))
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        prefetch_chunks(mod.qweight, chunks, take)
        if mod.scales.shape[0] % chunks == 0:
            prefetch_chunks(mod.scales, chunks, take)
        else:
            prefetch_chunks(mod.scales, 1, 1.0)
    _FORKED.add(idx)


def join(device: torch.device) -> None:
    """Make the current stream wait for the prefetches forked since the last join (stream capture
    requires every fork to be joined before it ends)."""
    if device.type != "cuda":
        return
    idx = device.index if device.index is not None else torch.cuda.current_device()
    if idx in _FORKED:
        torch.cuda.current_stream(device).wait_stream(_SIDE[idx])
        _FORKED.discard(idx)

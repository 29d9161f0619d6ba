"""Start pulling a tensor's bytes into the GPU's L2 cache without waiting for them (sm_90+).

Hand-written because neither torch nor Triton exposes the Hopper bulk prefetch: one
`cp.async.bulk.prefetch.L2.global [addr], size` per lane hands a CHUNK-byte range to the copy
engine and returns at once (no registers, no shared memory, nothing to wait for), so a tiny grid
queues megabytes of DRAM reads. The decode step uses it to fetch the head of the next weight
matrix while the small latency-bound kernels between two GEMMs leave DRAM idle (fast_model.py).
Import lazily: CPU-only installs have no triton.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

# Launch shape: bytes per lane (a multiple of 16, as the instruction requires), lanes per program
# (one chunk each), warps per program. The copy engine of one SM sustains about its share of
# DRAM bandwidth (H200: 16 programs of 128 x 16 KB queued ~6 MB in 11 µs), so the grid must
# cover every SM: benchmarks/prefetch_bench.py sweeps PREFETCH_CONFIGS.
PREFETCH_CONFIGS = ((16384, 128, 4), (4096, 32, 1), (2048, 32, 1), (1024, 32, 1))
CONFIG = (4096, 32, 1)


@triton.jit
def _prefetch_kernel(base_ptr, nbytes, CHUNK: tl.constexpr, PER: tl.constexpr):
    offs = (tl.program_id(0) * PER + tl.arange(0, PER)).to(tl.int64) * CHUNK
    size = tl.minimum(nbytes - offs, CHUNK).to(tl.int32)
    tl.inline_asm_elementwise(
        "{\n.reg .pred p;\nsetp.gt.s32 p, $2, 0;\n@p cp.async.bulk.prefetch.L2.global [$1], $2;\nmov.b32 $0, 0;\n}",
        "=r,l,r", [base_ptr + offs, size], dtype=tl.int32, is_pure=False, pack=1)


def supported(device: torch.device) -> bool:
    return device.type == "cuda" and torch.cuda.get_device_capability(device)[0] >= 9


def l2_prefetch(t: torch.Tensor, max_bytes: int) -> None:
    """Queue an L2 prefetch of the first min(max_bytes, t's bytes) bytes of contiguous `t`
    (rounded down to 16 bytes) on the current stream."""
    nbytes = min(int(max_bytes), t.numel() * t.element_size()) // 16 * 16
    if nbytes <= 0:
        return
    assert t.is_contiguous() and t.data_ptr() % 16 == 0
    chunk, per, warps = CONFIG
    grid = (triton.cdiv(nbytes, chunk * per),)
    _prefetch_kernel[grid](t.view(-1).view(torch.uint8), nbytes, CHUNK=chunk, PER=per, num_warps=warps)

"""The read floor of a weight-streaming kernel: the time per call of a kernel that only reads the
same bytes once (and xors them into one word per program), launched like ours (PDL, its wait first)
and timed in the same harness (a CUDA graph of back-to-back calls rotating over copies); the
fastest of READ_CONFIGS' launch shapes. A kernel that must read the same bytes after its PDL wait
and also compute should not expect to beat it, so bf16 time / read floor is, in practice, the most
a W4A16 kernel can gain on a shape of this GPU (an empirical floor, not a proof).

Hand-written because the floor must be a plain Triton kernel with our launch path (PDL), not a
library copy (cudaMemcpy writes as many bytes as it reads, and torch reductions add their own
passes)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from salactl.runtime.ops.pdl import launch_args, pdl_wait
from timing import graph_time_us

# (programs per SM, int32 words per program and step, warps, pipeline stages)
READ_CONFIGS = ((2, 4096, 8, 3), (4, 4096, 8, 3), (4, 2048, 4, 3), (8, 1024, 4, 3), (4, 4096, 8, 1),
                (8, 2048, 4, 2), (16, 1024, 4, 2), (1, 8192, 8, 4))


@triton.jit
def _read_kernel(a_ptr, n, out_ptr, BLOCK: tl.constexpr, STAGES: tl.constexpr, PDL: tl.constexpr = False):
    pdl_wait(PDL)
    pid = tl.program_id(0)
    acc = tl.zeros([BLOCK], tl.int32)
    for start in tl.range(pid * BLOCK, n, tl.num_programs(0) * BLOCK, num_stages=STAGES):
        offs = start + tl.arange(0, BLOCK)
        acc ^= tl.load(a_ptr + offs, mask=offs < n, other=0, cache_modifier=".cg")
    tl.store(out_ptr + pid, tl.xor_sum(acc, 0))


def read_once(buf: torch.Tensor, out: torch.Tensor, config, sms: int) -> None:
    """Read every int32 word of `buf` once (out: int32, at least programs long)."""
    per_sm, block, warps, stages = config
    grid = min(per_sm * sms, triton.cdiv(buf.numel(), block))
    _read_kernel[(grid,)](buf, buf.numel(), out, BLOCK=block, STAGES=stages, num_warps=warps,
                          **launch_args(buf.device))


def read_floor_us(nbytes: int, copies: int, calls: int) -> tuple[float, str]:
    """(fastest us per call over READ_CONFIGS, its config) of reading `nbytes` (rounded up to whole
    words) from `copies` rotating buffers, `calls` calls per graph."""
    bufs = [torch.randint(-2 ** 31, 2 ** 31 - 1, (triton.cdiv(nbytes, 4),), dtype=torch.int32, device="cuda")
            for _ in range(copies)]
    sms = torch.cuda.get_device_properties(bufs[0].device).multi_processor_count
    out = torch.empty(16 * sms, dtype=torch.int32, device="cuda")
    best = (float("inf"), "")
    for cfg in READ_CONFIGS:
        t = graph_time_us([lambda i=i, c=cfg: read_once(bufs[i % copies], out, c, sms) for i in range(calls)])
        best = min(best, (t, "pps{} block{} w{} st{}".format(*cfg)))
    return best

"""Fire-and-forget L2 prefetch of whole byte ranges from a Triton kernel (sm_90+).

Hand-written because Triton has no prefetch: a load would make the program wait for the bytes.
`cp.async.bulk.prefetch.L2` (PTX 8.0, Hopper) asks the L2 for up to a page in one instruction and
never blocks the issuing thread; a later kernel's loads of those bytes then hit L2. The decode
selection's top-k uses it on the K/V pages of the blocks it has just selected, so the attention
that reads them next (BENCHMARKS.md, GPU engine session 29) does not start from DRAM. Under the
Triton interpreter and before sm_90 the callers pass `on=False` (`available`)."""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from salactl.runtime.ops.pdl import is_sm90


def available(device: torch.device) -> bool:
    """Whether kernels on `device` may prefetch (a compiled sm_90+ CUDA kernel, not the interpreter)."""
    return device.type == "cuda" and os.environ.get("TRITON_INTERPRET") != "1" and is_sm90(device)


@triton.jit
def prefetch_l2(ptr, nbytes, mask):
    """Prefetch `nbytes` (a multiple of 16) from each 16-byte aligned pointer of `ptr` into L2
    where `mask` holds. Returns zeros of ptr's shape (inline asm needs a result; callers drop it)."""
    return tl.inline_asm_elementwise(
        "{ .reg .pred p; setp.ne.b32 p, $3, 0; @p cp.async.bulk.prefetch.L2.global [$1], $2; mov.b32 $0, 0; }",
        "=r,l,r,r", [ptr, tl.full(ptr.shape, nbytes, tl.int32), mask.to(tl.int32)],
        dtype=tl.int32, is_pure=False, pack=1)

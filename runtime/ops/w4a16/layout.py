"""In-memory int4 layout of our Triton W4A16 kernel (pure PyTorch, so it is testable without Triton).

The checkpoint stays GPTQ v1 (nibble j of word row r holds k = 8r + j). At load time we repack
each block of 128 input rows so that nibble j of word row r holds k = k0 + 16·j + r (r < 16).
Then one shift + mask of a [16, BLOCK_N] word tile yields the 16 *consecutive* rows
k0+16j .. k0+16j+15: a ready operand for a k=16 tensor-core dot, with no gather or reshape.
Same size as GPTQ: int32 [K/8, N]. K must be a multiple of 128 (Marlin's own rule).
"""

from __future__ import annotations

import torch

from salactl.errors import QuantizationError

K_BLOCK = 128
ROWS_PER_BLOCK = K_BLOCK // 8     # int32 word rows per 128-row block


def pack_interleaved(q: torch.Tensor) -> torch.Tensor:
    """q: values [K, N] in [0, 16) -> int32 [K/8, N] in the kernel's interleaved layout."""
    K, N = q.shape
    if K % K_BLOCK:
        raise QuantizationError(f"in_features {K} is not a multiple of {K_BLOCK}; the W4A16 kernel needs it")
    v = q.to(torch.int64).reshape(K // K_BLOCK, 8, ROWS_PER_BLOCK, N)        # [b, j, r, N]
    shifts = (torch.arange(8, device=q.device, dtype=torch.int64) * 4).view(1, 8, 1, 1)
    words = (v << shifts).sum(dim=1)                                          # [b, r, N]
    words = torch.where(words >= 2 ** 31, words - 2 ** 32, words)
    return words.reshape(K // 8, N).to(torch.int32).contiguous()


def unpack_interleaved(words: torch.Tensor) -> torch.Tensor:
    """Inverse of `pack_interleaved`: int32 [K/8, N] -> values [K, N]."""
    R, N = words.shape
    w = words.reshape(R // ROWS_PER_BLOCK, 1, ROWS_PER_BLOCK, N)
    shifts = (torch.arange(8, device=words.device, dtype=torch.int32) * 4).view(1, 8, 1, 1)
    return ((w >> shifts) & 0xF).reshape(R * 8, N)

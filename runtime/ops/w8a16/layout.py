"""In-memory int8 layout of the W8A16 tensor-core kernel (triton_tc.py), pure PyTorch so that it is
testable without Triton.

The checkpoint stays GPTQ v1 (8-bit codes u = q + 128 in [0, 256), four per int32 along K); at load
time on CUDA the codes are repacked into the MMA register order below (`pack_tc8`), the same size
(K·N/4 int32 words). K must be a multiple of 64 and N of 16.

For each 64-row K block kb and each group of 16 output rows g, 256 int32 words,
    widx = n8·128 + nlo·16 + c·4 + t          (row n = 16g + 8·n8 + nlo)
exactly the word order of the W4A16 layout (runtime/ops/w4a16/layout.py, whose loads the kernel
shares), with t the k=16 MMA tile of the block instead of a pair of them. The 4 bytes of a word are
lane (nlo, c)'s slice of that tile's A operand: element j = 2·half8 + pair is
k = 64·kb + 16·t + 8·half8 + 2c + pair, in byte half8 + 2·pair, so that bytes 0 and 2 (and 1 and
3) are one bf16x2 register's pair after the kernel's LOP3 (nibbles at bits 0-3 and 16-19).
"""

from __future__ import annotations

import torch

from salactl.errors import QuantizationError
from salactl.runtime.ops.w4a16.layout import pack_words, unpack_words

K_BLOCK8 = 64
TC_ROWS = 16


def _tc8_index(K: int, N: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """For every (k, n): the flat word index and the byte shift in the tensor-core layout."""
    k = torch.arange(K, device=device).view(K, 1)
    n = torch.arange(N, device=device).view(1, N)
    kb, kl = k // K_BLOCK8, k % K_BLOCK8
    t, half8, c, pair = kl // 16, (kl // 8) % 2, (kl // 2) % 4, kl % 2
    g, n8, nlo = n // TC_ROWS, (n // 8) % 2, n % 8
    word = (kb * (N // TC_ROWS) + g) * 256 + n8 * 128 + nlo * 16 + c * 4 + t
    shift = 8 * (half8 + 2 * pair)
    return word, shift.expand(K, N)


def tc8_fits(K: int, N: int, group_size: int = -1) -> bool:
    """Whether a [K, N] weight with this GPTQ group size takes the tensor-core layout: whole 64-row
    blocks, whole 16-row tiles, and groups the kernel scales per block (per-channel, or a multiple
    of 64 dividing K)."""
    return K % K_BLOCK8 == 0 and N % TC_ROWS == 0 and (
        group_size == -1 or (group_size % K_BLOCK8 == 0 and K % group_size == 0))


def pack_tc8(u: torch.Tensor) -> torch.Tensor:
    """u: unsigned 8-bit codes [K, N] in [0, 256) -> int32 [K/64, N/16, 256] in the tensor-core layout."""
    K, N = u.shape
    if not tc8_fits(K, N):
        raise QuantizationError(f"a {N}x{K} weight needs in_features % {K_BLOCK8} == 0 and "
                                f"out_features % {TC_ROWS} == 0 for the W8A16 tensor-core kernel")
    word, shift = _tc8_index(K, N, u.device)
    return pack_words(u, word, shift, K * N // 4).reshape(K // K_BLOCK8, N // TC_ROWS, 256)


def unpack_tc8(words: torch.Tensor) -> torch.Tensor:
    """Inverse of `pack_tc8`: int32 [K/64, N/16, 256] -> codes [K, N] in [0, 256)."""
    K, N = words.shape[0] * K_BLOCK8, words.shape[1] * TC_ROWS
    return unpack_words(words, *_tc8_index(K, N, words.device), 0xFF)

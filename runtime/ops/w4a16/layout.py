"""In-memory int4 layout of our Triton W4A16 kernel (pure PyTorch, so it is testable without Triton).

The checkpoint stays GPTQ v1 (nibble j of word row r holds k = 8r + j); at load time each weight is
repacked into the tensor-core register order below (`pack_tc`), the same size as GPTQ (K·N/8 int32
words). K must be a multiple of 128 (Marlin's own rule) and N of 16.
"""

from __future__ import annotations

import torch

from salactl.errors import QuantizationError

K_BLOCK = 128

# Tensor-core register layout (triton_tc.py).
# For each 128-row K block kb and each group of 16 output rows g, 256 int32 words, word index
#   widx = n8·128 + nlo·16 + c·4 + blk          (row n = 16g + 8·n8 + nlo)
# The 8 values of a word are the thread's own slice of a k=16 MMA A-operand (rows = output
# features): element j = 4·tile + 2·half8 + pair is k = kb·128 + 32·blk + 16·tile + 8·half8 + 2c + pair.
# Element j sits in nibble p(j) = i + 4·pair with i = 2·half8 + tile, because the kernel's
# dequantization turns nibbles (i, i+4) of a word into one bf16x2 register with one LOP3.
# A warp's load of 16 bytes per lane is then 512 contiguous bytes and lands in registers exactly
# where the MMA wants it (no shared-memory round trip). int32 [K/128, N/16, 256] = K·N/8 words.
TC_ROWS = 16


def _tc_index(K: int, N: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """For every (k, n): the flat word index and the nibble shift in the tensor-core layout."""
    k = torch.arange(K, device=device).view(K, 1)
    n = torch.arange(N, device=device).view(1, N)
    kb, kl = k // K_BLOCK, k % K_BLOCK
    blk, tile, half8, c, pair = kl // 32, (kl // 16) % 2, (kl // 8) % 2, (kl // 2) % 4, kl % 2
    g, n8, nlo = n // TC_ROWS, (n // 8) % 2, n % 8
    widx = n8 * 128 + nlo * 16 + c * 4 + blk
    word = (kb * (N // TC_ROWS) + g) * 256 + widx
    shift = 4 * ((2 * half8 + tile) + 4 * pair)
    return word, shift.expand(K, N)


def pack_words(values: torch.Tensor, word: torch.Tensor, shift: torch.Tensor, n_words: int) -> torch.Tensor:
    """Bit-field packing: values [K, N] (non-negative, each fitting its field) OR-ed into int32
    words at word[k, n], bit shift[k, n] -> int32 [n_words]."""
    words = torch.zeros(n_words, dtype=torch.int64, device=values.device)
    words.index_add_(0, word.reshape(-1), (values.to(torch.int64) << shift).reshape(-1))
    return torch.where(words >= 2 ** 31, words - 2 ** 32, words).to(torch.int32)


def unpack_words(words: torch.Tensor, word: torch.Tensor, shift: torch.Tensor, mask: int) -> torch.Tensor:
    """Inverse of `pack_words`: the [K, N] fields of `mask` bits."""
    return (words.reshape(-1)[word] >> shift.to(torch.int32)) & mask


def pack_tc(q: torch.Tensor) -> torch.Tensor:
    """q: values [K, N] in [0, 16) -> int32 [K/128, N/16, 256] in the tensor-core layout."""
    K, N = q.shape
    if K % K_BLOCK or N % TC_ROWS:
        raise QuantizationError(f"a {N}x{K} weight needs in_features % {K_BLOCK} == 0 and "
                                f"out_features % {TC_ROWS} == 0 for the W4A16 tensor-core kernel")
    word, shift = _tc_index(K, N, q.device)
    return pack_words(q, word, shift, K * N // 8).reshape(K // K_BLOCK, N // TC_ROWS, 256)


def unpack_tc(words: torch.Tensor) -> torch.Tensor:
    """Inverse of `pack_tc`: int32 [K/128, N/16, 256] -> values [K, N]."""
    K, N = words.shape[0] * K_BLOCK, words.shape[1] * TC_ROWS
    return unpack_words(words, *_tc_index(K, N, words.device), 0xF)

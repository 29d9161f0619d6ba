"""Plain-PyTorch reference for GPTQ weight-only linears: unpack, dequantize, matmul.

W[n, k] = scales[g_idx[k], n] · (q[k, n] - zeros[g_idx[k], n]); y = x Wᵀ. Computed in fp32 and
returned in x's dtype. Every fast path (Triton kernel, CPU int4 op) is tested against this.
"""

from __future__ import annotations

import torch

from salactl.quant.packing import unpack_qweight, unpack_qzeros


def dequantize(qweight: torch.Tensor, scales: torch.Tensor, g_idx: torch.Tensor, bits: int,
               qzeros: torch.Tensor | None = None, fmt: str = "gptq") -> torch.Tensor:
    """fp32 weight [N, K] from GPTQ tensors: zeros from `qzeros` (+ fmt), else the symmetric 2^(bits-1)."""
    q = unpack_qweight(qweight, bits).float()                      # [K, N]
    g = g_idx.long()
    if qzeros is not None:
        z = unpack_qzeros(qzeros, bits, fmt).float()[g]            # [K, N]
    else:
        z = float(2 ** (bits - 1))
    return ((q - z) * scales.float()[g]).t().contiguous()


def w4a16_matmul(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor, g_idx: torch.Tensor,
                 bits: int = 4, qzeros: torch.Tensor | None = None) -> torch.Tensor:
    """x [..., K] -> x Wᵀ [..., N] in fp32 arithmetic, cast to x's dtype."""
    w = dequantize(qweight, scales, g_idx, bits, qzeros).to(x.device)
    return (x.float() @ w.t()).to(x.dtype)

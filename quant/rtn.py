"""Round-to-nearest: the same symmetric group quantizer as GPTQ, without error feedback.
The baseline GPTQ is judged against (`--method rtn`, and the 'RTN error' column)."""

from __future__ import annotations

import torch

from salactl.quant.packing import default_g_idx
from salactl.quant.quantizer import QuantizedWeight, QuantSpec, dequantize_codes, group_scale, quantize_column


def rtn_quantize(w: torch.Tensor, spec: QuantSpec) -> QuantizedWeight:
    w = w.float()
    N, K = w.shape
    g = spec.group_of(K)
    codes = torch.empty(N, K, device=w.device, dtype=torch.uint8)
    deq = torch.empty_like(w)
    scales = []
    for g0 in range(0, K, g):
        blk = w[:, g0:g0 + g]
        s = group_scale(blk, spec)
        q = quantize_column(blk, s[:, None], spec)
        codes[:, g0:g0 + g] = q.to(torch.uint8)
        deq[:, g0:g0 + g] = dequantize_codes(q, s[:, None], spec)
        scales.append(s)
    return QuantizedWeight(codes, torch.stack(scales).to(torch.float16), default_g_idx(K, spec.group_size, w.device),
                           deq)

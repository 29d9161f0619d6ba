"""Per-tile tickets for split-K kernels that finish in one launch (the last split of a tile sums
the partials): an int32 buffer per (device, stream), zero between calls because every kernel
resets the tickets it used. Sized once (4096 tiles) so CUDA graphs captured later keep pointing
at the same buffer."""

from __future__ import annotations

import torch

_BUFFERS: dict[tuple, torch.Tensor] = {}


def split_counters(device: torch.device, n: int) -> torch.Tensor:
    key = (device, torch.cuda.current_stream(device).stream_id if device.type == "cuda" else 0)
    buf = _BUFFERS.get(key)
    if buf is None or buf.numel() < n:
        buf = torch.zeros(max(n, 4096), dtype=torch.int32, device=device)
        _BUFFERS[key] = buf
    return buf

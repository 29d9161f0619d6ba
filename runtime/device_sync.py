"""Wait for a device's queued work before reading a host clock (a no-op on CPU)."""

from __future__ import annotations

import torch


def synchronize(device) -> None:
    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)

from __future__ import annotations

import torch.nn.functional as F
from torch import nn


class MLP(nn.Module):
    """down(silu(gate(x)) * up(x)); gate/up stay separate, as in the checkpoint."""

    def __init__(self, hidden: int, intermediate: int):
        super().__init__()
        self.gate_proj = nn.Linear(hidden, intermediate, bias=False)
        self.up_proj = nn.Linear(hidden, intermediate, bias=False)
        self.down_proj = nn.Linear(intermediate, hidden, bias=False)

    def forward(self, x, timer):
        with timer("mlp"):
            return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))

"""Absolute position embeddings added once at the bottom of the 2017 model (section 7.1).

"learned": a trained table of max_seq_len rows; a position past the table has no entry.
"sinusoidal": PE(p, 2i) = sin(p / 10000^(2i/d)), PE(p, 2i+1) = cos(p / 10000^(2i/d))
(Vaswani et al., 2017), computed for any position.
"""

from __future__ import annotations

import torch
from torch import nn


def sinusoidal_table(positions: torch.Tensor, d_model: int) -> torch.Tensor:
    """(..., D) float32 for integer positions (...)."""
    inv = 1.0 / (10000.0 ** (torch.arange(0, d_model, 2, dtype=torch.float32, device=positions.device) / d_model))
    angles = positions.to(torch.float32)[..., None] * inv  # (..., D/2)
    return torch.stack((angles.sin(), angles.cos()), dim=-1).flatten(-2)[..., :d_model]


class LearnedPositions(nn.Module):
    def __init__(self, max_seq_len: int, d_model: int):
        super().__init__()
        self.table = nn.Embedding(max_seq_len, d_model)

    def forward(self, position_ids: torch.Tensor) -> torch.Tensor:
        n = self.table.num_embeddings
        if not position_ids.is_meta and (int(position_ids.max()) >= n or int(position_ids.min()) < 0):
            raise ValueError(
                f"position {int(position_ids.max())} is past the learned position table ({n} entries, "
                f"positions 0..{n - 1}); a learned table has no entry beyond its training length"
            )
        return self.table(position_ids)


class SinusoidalPositions(nn.Module):
    def __init__(self, d_model: int):
        super().__init__()
        self.d_model = d_model

    def forward(self, position_ids: torch.Tensor) -> torch.Tensor:
        return sinusoidal_table(position_ids, self.d_model)

"""ALiBi, attention with linear biases (Press, Smith & Lewis, 2022; module section 15.2).

No position enters the vectors; each head subtracts slope * distance from its scores:
    score(i, j) += -m_h * (i - j)
Slopes for n heads, n a power of two: m_h = 2^(-8h/n), h = 1..n (8 heads: 1/2 .. 1/256).
Otherwise take the slopes of the nearest lower power of two n0 and add every other slope of
2 n0 heads, as the paper's reference code does (`get_slopes` in ofirpress/attention_with_linear_biases).
"""

from __future__ import annotations

import math

import torch
from torch import nn


def _power_of_two_slopes(n: int) -> list[float]:
    start = 2.0 ** (-8.0 / n)
    return [start ** (h + 1) for h in range(n)]


def alibi_slopes(n_heads: int) -> torch.Tensor:
    """(n_heads,) float32 slopes."""
    if n_heads <= 0:
        raise ValueError(f"n_heads must be positive, got {n_heads}")
    n0 = 2 ** math.floor(math.log2(n_heads))
    slopes = _power_of_two_slopes(n0)
    if n0 < n_heads:
        slopes += _power_of_two_slopes(2 * n0)[0::2][: n_heads - n0]
    return torch.tensor(slopes, dtype=torch.float32)


def alibi_bias(slopes: torch.Tensor, q_pos: torch.Tensor, k_pos: torch.Tensor) -> torch.Tensor:
    """Bias (h, t, s) = -slope * (q_pos - k_pos) for query positions (t,) and key positions (s,).

    Keys after the query get a positive bias here; the causal mask removes them anyway.
    """
    distance = (q_pos[:, None] - k_pos[None, :]).to(torch.float32)  # (t, s)
    return -slopes[:, None, None] * distance


class ALiBi(nn.Module):
    """ALiBi for one model: its heads' slopes, built once; `bias` gives the score offsets.

    A module only so that the slopes (a non-persistent buffer: derived, never stored in a
    checkpoint) follow the model across devices.
    """

    def __init__(self, n_heads: int):
        super().__init__()
        self.register_buffer("slopes", alibi_slopes(n_heads), persistent=False)

    def bias(self, q_pos: torch.Tensor, k_pos: torch.Tensor) -> torch.Tensor:
        """(h, t, s) float32 for query positions (t,) and key positions (s,)."""
        return alibi_bias(self.slopes, q_pos, k_pos)

"""Feed-forward layers (module section 15.4).

    2017:    MLP(x)    = act(x W_1 + b_1) W_2 + b_2,   act = ReLU or GELU, d_ff = 4 d
    SwiGLU:  FFN(x)    = (Swish(x W_gate) * (x W_up)) W_down,   Swish(z) = z sigmoid(z)
    GeGLU:   the same with tanh-approximated GELU in place of Swish (Gemma)

The gated forms have three matrices, so at equal parameters d_ff shrinks from 4d to 8d/3
(3 * d * 8d/3 = 8 d^2 = 2 * d * 4d); LLaMA rounds up to a multiple of 256 (4096 -> 11008).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn


def gated_ffn_width(d_model: int, multiple_of: int = 256) -> int:
    """8/3 d rounded up to a multiple: 4096 -> 10922.67 -> 11008 (LLaMA 7B)."""
    if d_model <= 0 or multiple_of <= 0:
        raise ValueError(f"d_model and multiple_of must be positive, got {d_model}, {multiple_of}")
    return multiple_of * math.ceil(8 * d_model / 3 / multiple_of)


def default_ffn_width(d_model: int, ffn: str) -> int:
    return gated_ffn_width(d_model) if ffn in ("swiglu", "geglu") else 4 * d_model


def swish(z: torch.Tensor) -> torch.Tensor:
    """Swish with beta = 1, also called SiLU: z * sigmoid(z)."""
    return F.silu(z)


class GatedFFN(nn.Module):
    """SwiGLU (act="swiglu") or GeGLU (act="geglu"). x: (b, t, D) -> (b, t, D)."""

    def __init__(self, d_model: int, d_ff: int, act: str = "swiglu", bias: bool = False):
        super().__init__()
        if act not in ("swiglu", "geglu"):
            raise ValueError(f"gated act must be 'swiglu' or 'geglu', got {act!r}")
        self.act = act
        self.w_gate = nn.Linear(d_model, d_ff, bias=bias)
        self.w_up = nn.Linear(d_model, d_ff, bias=bias)
        self.w_down = nn.Linear(d_ff, d_model, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        g = gate_activation(self.w_gate(x), self.act)  # (b, t, d_ff)
        return self.w_down(g * self.w_up(x))


def gate_activation(g: torch.Tensor, act: str) -> torch.Tensor:
    """The gate's nonlinearity: Swish for SwiGLU, tanh-approximated GELU for GeGLU (Gemma)."""
    return swish(g) if act == "swiglu" else F.gelu(g, approximate="tanh")


class MLP(nn.Module):
    """The 2017 feed-forward layer: two matrices with ReLU or (exact) GELU between."""

    def __init__(self, d_model: int, d_ff: int, act: str = "relu", bias: bool = True):
        super().__init__()
        if act not in ("relu", "gelu"):
            raise ValueError(f"act must be 'relu' or 'gelu', got {act!r}")
        self.act = act
        self.w_in = nn.Linear(d_model, d_ff, bias=bias)
        self.w_out = nn.Linear(d_ff, d_model, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.w_in(x)
        return self.w_out(F.relu(h) if self.act == "relu" else F.gelu(h))


def make_ffn(cfg) -> nn.Module:
    if cfg.ffn in ("swiglu", "geglu"):
        return GatedFFN(cfg.d_model, cfg.d_ff, cfg.ffn, bias=cfg.mlp_bias)
    return MLP(cfg.d_model, cfg.d_ff, cfg.ffn, bias=cfg.mlp_bias)

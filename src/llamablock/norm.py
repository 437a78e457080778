"""Normalization layers (module section 15.3): RMSNorm, and LayerNorm for the 2017 block.

    RMSNorm(x) = x / sqrt(mean(x^2) + eps) * gamma        (Zhang & Sennrich, 2019)

No mean is subtracted and there is no shift beta, so it has d parameters where LayerNorm
has 2d. Gemma stores gamma as w with output x / rms * (1 + w); `offset=1.0` selects that.

Where the dtype changes: the statistic and the normalized x are computed in float32 (a
half-precision sum of squares over thousands of features loses digits), then x is cast back
to the input dtype *before* the multiply by gamma, in the order transformers' LlamaRMSNorm
uses. Gemma's variant multiplies by (1 + w) in float32 and casts last, as GemmaRMSNorm does.
The output has the input's dtype in both.
"""

from __future__ import annotations

import torch
from torch import nn


def rms_normalize(x: torch.Tensor, eps: float) -> torch.Tensor:
    """x / sqrt(mean(x^2) + eps) over the last axis, in float32: the statistic every RMSNorm here
    (this module's, the compiled one in llamablock.fast.compiled.fused, the tracer's) computes."""
    x32 = x.float()
    return x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, offset: float = 0.0) -> torch.Tensor:
    """RMSNorm(x) with scale `weight` (Gemma: offset 1, scale 1 + weight); output in x's dtype."""
    normed = rms_normalize(x, eps)
    if offset:
        return (normed * (offset + weight.float())).type_as(x)
    return weight * normed.type_as(x)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6, offset: float = 0.0):
        super().__init__()
        self.eps = eps
        self.offset = offset
        # Gemma's (1 + w) starts from w = 0; plain RMSNorm starts from gamma = 1.
        self.weight = nn.Parameter(torch.zeros(dim) if offset else torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, self.weight, self.eps, self.offset)

    def extra_repr(self) -> str:
        return f"{self.weight.shape[0]}, eps={self.eps}, offset={self.offset}"


def make_norm(kind: str, dim: int, eps: float, offset: float = 0.0) -> nn.Module:
    """RMSNorm, or torch's LayerNorm (with its shift beta: 2d parameters)."""
    if kind == "rmsnorm":
        return RMSNorm(dim, eps, offset)
    if kind == "layernorm":
        return nn.LayerNorm(dim, eps=eps)
    raise ValueError(f"norm must be 'rmsnorm' or 'layernorm', got {kind!r}")

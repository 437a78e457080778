"""RMSNorm and RoPE fused into one kernel each by torch.compile (CPU speed).

Eager RMSNorm runs five separate ops (float cast, square, mean, rsqrt, two multiplies), each
reading and writing the whole activation; LayerNorm is a single ATen kernel, so on a CPU the
eager RMSNorm is *slower* than LayerNorm although it does less arithmetic (measured by
`llamablock bench norm`). The module's "RMSNorm saves 10-15%" holds only once the ops are
fused into one pass over memory, which is what inductor generates here.

The maths is exactly that of `llamablock.norm.RMSNorm` (statistic in float32, cast back before
the multiply by gamma, as transformers' LlamaRMSNorm) and `llamablock.rope.apply_rope`
(both pair layouts); the functions below call the same code, so the compiled kernels can only
differ by the order of float32 additions (tests: within 1e-6).
Compilation happens on first call per shape and dtype (seconds; inductor caches it on disk).
"""

from __future__ import annotations

import functools

import torch

from llamablock.norm import rms_norm
from llamablock.rope import apply_rope


@functools.cache
def _compiled(fn):
    # dynamic=False: one specialised kernel per shape, the fastest for fixed decode shapes.
    return torch.compile(fn, dynamic=False, fullgraph=True)


def fused_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """`llamablock.norm.rms_norm` (no Gemma offset) as one compiled kernel."""
    return _compiled(rms_norm)(x, weight, eps)


def fused_apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, layout: str) -> torch.Tensor:
    """`llamablock.rope.apply_rope` as one compiled kernel (x (b, h, t, d), cos/sin (b, t, r/2))."""
    return _compiled(apply_rope)(x, cos, sin, layout)

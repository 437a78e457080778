"""Whether a tensor holds only finite values, at the cost of one sum.

Loaders refuse a checkpoint with a NaN or infinite weight (such a model loads and runs; only its
outputs are wrong), so every float tensor of a model is checked on every load. `isfinite(t).all()`
writes a boolean tensor as large as `t` and then reduces it; a sum is one reduction without it,
and a NaN or an infinity in `t` makes the sum NaN or infinite (inf + -inf is NaN). The sum can
also overflow for finite values near the dtype's largest; only then is the exact check run.
"""

from __future__ import annotations

import torch


def all_finite(t: torch.Tensor) -> bool:
    """True when every value of the floating-point tensor `t` is finite."""
    total = t.sum(dtype=torch.float64 if t.dtype == torch.float64 else torch.float32)
    return bool(torch.isfinite(total)) or bool(torch.isfinite(t).all())  # a non-finite sum: overflow, or a real NaN

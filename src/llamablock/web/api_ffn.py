"""Figure of module section 15.4 (`swiglu-gate`): one SwiGLU hidden unit.

The unit computes Swish(gate) * up, with `llamablock.ffn.swish` (z * sigmoid(z), beta = 1);
ReLU and GELU come from torch.nn.functional, the same calls the 2017 `MLP` makes, so the page
can draw all three curves and mark the gate input on each. A plain (ungated) unit has one
input and outputs act(gate): the `up` input cannot change it.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from fastapi import APIRouter, Query

from llamablock.ffn import swish

router = APIRouter()

LIMIT = 8.0  # slider range; Swish(-8) is -0.0027, the gate is shut well before
CURVE_POINTS = 161


def _acts(z: torch.Tensor) -> dict[str, torch.Tensor]:
    # GELU exact (erf), as nn.GELU() and the 2017 MLP; Gemma's GeGLU uses the tanh form.
    return {"swish": swish(z), "relu": F.relu(z), "gelu": F.gelu(z)}


@router.get("/api/swiglu-gate")
def swiglu_gate(
    gate: float = Query(1.0, ge=-LIMIT, le=LIMIT, allow_inf_nan=False, description="x W_gate for this unit"),
    up: float = Query(1.5, ge=-LIMIT, le=LIMIT, allow_inf_nan=False, description="x W_up for this unit"),
) -> dict:
    z = torch.linspace(-LIMIT, LIMIT, CURVE_POINTS, dtype=torch.float64)
    g = torch.tensor([gate], dtype=torch.float64)
    at = {name: float(v) for name, v in _acts(g).items()}
    return {
        "gate": gate, "up": up,
        "x": z.tolist(),
        "curves": {name: v.tolist() for name, v in _acts(z).items()},
        "at_gate": at,  # act(gate) for each activation
        "product": at["swish"] * up,  # the SwiGLU unit's output before W_down
        "plain": {"relu": at["relu"], "gelu": at["gelu"]},  # ungated units: up has no effect
    }

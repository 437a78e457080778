"""Section 15.4: SwiGLU: Swish values, the gate, the 8/3 width rule (exact arithmetic)."""

from __future__ import annotations

import math

import torch

from llamablock.ffn import MLP, GatedFFN, gated_ffn_width, swish
from llamablock.lab.record import Claim

# The ids of the claims this experiment records (for `llamablock lab --only`).
CLAIMS = (
    "15.4.swish-values",
    "15.4.gate-closes",
    "15.4.equal-params",
    "15.4.width-rule",
)


def claim_swish_values() -> Claim:
    s2, sm2 = swish(torch.tensor(2.0, dtype=torch.float64)).item(), swish(torch.tensor(-2.0, dtype=torch.float64)).item()
    c = Claim("15.4.swish-values", "15.4", "Swish(2) ~ 1.76, Swish(-2) ~ -0.24", [1.76, -0.24],
              measured=[round(s2, 6), round(sm2, 6)], unit="", tolerance="equal at 2 decimals")
    return c.judge(round(s2, 2) == 1.76 and round(sm2, 2) == -0.24,
                   f"closed form z / (1 + e^-z): {2 / (1 + math.exp(-2)):.6f}, {-2 / (1 + math.exp(2)):.6f}")


def claim_gate_closes() -> Claim:
    c = Claim("15.4.gate-closes", "15.4", "large negative gate input: output ~ 0 whatever the up input", 0.0,
              unit="max |Swish(gate) * up| at gate = -20, up in [-100, 100]", tolerance="below 1e-5")
    up = torch.linspace(-100, 100, 2001, dtype=torch.float64)
    out = swish(torch.tensor(-20.0, dtype=torch.float64)) * up
    relu_out = torch.relu(torch.tensor(-20.0)) * up
    c.measured = float(out.abs().max())
    return c.judge(c.measured < 1e-5, f"Swish(-20) = {swish(torch.tensor(-20.0, dtype=torch.float64)).item():.3e}; "
                   f"ReLU would give exactly {float(relu_out.abs().max())}; a plain GELU unit has no second input to gate")


def claim_equal_params() -> Claim:
    d = 96  # divisible by 3, so 8/3 d is a whole number and the equality is exact
    gated = sum(p.numel() for p in GatedFFN(d, 8 * d // 3).parameters())
    plain = sum(p.numel() for p in MLP(d, 4 * d, bias=False).parameters())
    llama = 3 * 4096 * 11008 / (2 * 4096 * 4 * 4096)
    c = Claim("15.4.equal-params", "15.4", "three matrices at 8/3 d hold as many weights as two at 4d (8 d^2)",
              "8 d^2", measured=f"{gated} = {plain} = 8 x {d}^2 = {8 * d * d}", tolerance="exact")
    return c.judge(gated == plain == 8 * d * d, f"counted from the layers at d = {d}; LLaMA's rounding to 11008 "
                   f"at d = 4096 makes its FFN {llama:.4f}x the 4d MLP's size")


def claim_width_rule() -> Claim:
    raw = 8 * 4096 / 3
    c = Claim("15.4.width-rule", "15.4", "d = 4096: 8/3 d = 10922.67, rounded up to a multiple of 256 = 11008",
              [10922.67, 11008], measured=[round(raw, 2), gated_ffn_width(4096)], tolerance="exact")
    return c.judge(round(raw, 2) == 10922.67 and gated_ffn_width(4096) == 11008, "llamablock.ffn.gated_ffn_width")


def run(quick: bool, out) -> list[Claim]:
    return [claim_swish_values(), claim_gate_closes(), claim_equal_params(), claim_width_rule()]

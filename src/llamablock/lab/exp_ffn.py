"""Section 15.4: SwiGLU: Swish values, the gate, the 8/3 width rule, equal parameters and arithmetic.

Every value goes through `llamablock.ffn` (swish, GatedFFN, MLP, gated_ffn_width), read as module
attributes at call time, so a wrong activation or width rule in the library shows here.
"""

from __future__ import annotations

import math

import torch
from torch.utils.flop_counter import FlopCounterMode

from llamablock import ffn as ffn_lib
from llamablock.lab.details_text import said
from llamablock.lab.record import Claim

# The ids of the claims this experiment records (for `llamablock lab --only`).
CLAIMS = (
    "15.4.swish-values",
    "15.4.gate-closes",
    "15.4.equal-params",
    "15.4.equal-flops",
    "15.4.width-rule",
)


def claim_swish_values() -> Claim:
    s2 = ffn_lib.swish(torch.tensor(2.0, dtype=torch.float64)).item()
    sm2 = ffn_lib.swish(torch.tensor(-2.0, dtype=torch.float64)).item()
    c = Claim("15.4.swish-values", "15.4", "Swish(2) ~ 1.76, Swish(-2) ~ -0.24", [1.76, -0.24],
              measured=[round(s2, 4), round(sm2, 4)], unit="", tolerance="equal at 2 decimals")
    return c.judge(round(s2, 2) == 1.76 and round(sm2, 2) == -0.24,
                   said("15.4.swish-values", plus=2 / (1 + math.exp(-2)), minus=-2 / (1 + math.exp(2))))


def claim_gate_closes() -> Claim:
    """One SwiGLU hidden unit of the library's GatedFFN, driven through its own forward with a
    two-feature input: the gate projection reads feature 0, the up projection feature 1, the down
    projection passes the unit out. With the gate input at -20 the output must be 'almost zero
    whatever the up input', read as: below float32's resolution (epsilon) of the open gate's output
    at +20; and at both settings it must equal Swish(gate) x up computed from z x sigmoid(z) in
    float64, to float64 rounding (a few epsilons of the output's size), so that a different gate
    (ReLU, GELU) or swapped branches fail."""
    c = Claim("15.4.gate-closes", "15.4", "large negative gate input: output ~ 0 whatever the up input", 0.0,
              unit="max |output| at gate -20 / max |output| at gate +20, up in [-100, 100]",
              tolerance="below float32 epsilon; both equal Swish(gate) x up to float64 rounding")
    unit = ffn_lib.GatedFFN(2, 1).double()
    with torch.no_grad():
        unit.w_gate.weight.copy_(torch.tensor([[1.0, 0.0]]))  # the gate reads feature 0
        unit.w_up.weight.copy_(torch.tensor([[0.0, 1.0]]))  # the up branch reads feature 1
        unit.w_down.weight.fill_(1.0)
        up = torch.linspace(-100, 100, 2001, dtype=torch.float64)
        out = {g: unit(torch.stack([torch.full_like(up, g), up], dim=-1))[:, 0] for g in (-20.0, 20.0)}
    eps32, eps64 = float(torch.finfo(torch.float32).eps), float(torch.finfo(torch.float64).eps)
    expected = {g: g / (1 + math.exp(-g)) * up for g in out}  # Swish(z) = z sigmoid(z), Ramachandran et al.
    worst = max(float((out[g] - expected[g]).abs().max() / expected[g].abs().max()) for g in out)
    closed = float(out[-20.0].abs().max() / out[20.0].abs().max())
    c.measured = closed
    ok = closed < eps32 and worst < 8 * eps64
    return c.judge(ok, said("15.4.gate-closes", closed_max=float(out[-20.0].abs().max()), closed=closed,
                            open_max=float(out[20.0].abs().max()), eps32=eps32, worst=worst))


def _params(m: torch.nn.Module) -> int:
    return sum(p.numel() for p in m.parameters())


def claim_equal_params() -> Claim:
    d = 96  # divisible by 3, so 8/3 d is a whole number and the equality is exact
    width = ffn_lib.gated_ffn_width(d, multiple_of=1)
    gated = _params(ffn_lib.GatedFFN(d, width))
    plain = _params(ffn_lib.MLP(d, 4 * d, bias=False))
    llama = 3 * 4096 * ffn_lib.gated_ffn_width(4096) / (2 * 4096 * 4 * 4096)
    c = Claim("15.4.equal-params", "15.4", "three matrices at 8/3 d hold as many weights as two at 4d (8 d^2)",
              "8 d^2", measured=f"{gated:,} = {plain:,} = 8 x {d}^2", tolerance="exact")
    return c.judge(gated == plain == 8 * d * d, said("15.4.equal-params", d=d, width=width, llama=llama))


def claim_equal_flops() -> Claim:
    """'parameters and arithmetic are unchanged': matmul FLOPs of one forward, counted by torch."""
    d, t = 96, 64
    x = torch.randn(1, t, d)

    def flops(m):
        with FlopCounterMode(display=False) as fc, torch.no_grad():
            m(x)
        return fc.get_total_flops()

    gated = flops(ffn_lib.GatedFFN(d, ffn_lib.gated_ffn_width(d, multiple_of=1)))
    plain = flops(ffn_lib.MLP(d, 4 * d, bias=False))
    c = Claim("15.4.equal-flops", "15.4", "at 8/3 d SwiGLU does the same arithmetic as the 4d MLP", "unchanged",
              measured=f"{gated:,} vs {plain:,}", unit="matmul FLOPs per forward, 64 tokens at d = 96",
              tolerance="equal matmul FLOPs")
    # the element-wise Swish and product, about 4 x 8/3 d per token, against 2 x 8 d^2 of matmuls
    def share(width):
        return 4 * 8 / 3 * width / (2 * 8 * width ** 2)

    return c.judge(gated == plain, said("15.4.equal-flops", share=share(d), d=d, llama_share=share(4096)))


def claim_width_rule() -> Claim:
    got = ffn_lib.gated_ffn_width(4096)
    c = Claim("15.4.width-rule", "15.4", "LLaMA rounds 8/3 d up to a multiple: 11008 at d = 4096", 11008,
              measured=got, tolerance="exact")
    return c.judge(got == 11008, said("15.4.width-rule"))


def run(quick: bool, out) -> list[Claim]:
    return [claim_swish_values(), claim_gate_closes(), claim_equal_params(), claim_equal_flops(), claim_width_rule()]

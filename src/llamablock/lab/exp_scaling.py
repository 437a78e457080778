"""Section 15.2: stretching RoPE from 4,096 trained tokens to 32,768, and ALiBi.

Frequencies come from `llamablock.rope_scaling.rope_frequencies` (the code the models run,
checked against transformers in the tests); each claim is a closed form of the module.
"""

from __future__ import annotations

import torch

from llamablock.alibi import alibi_slopes
from llamablock.config import ModelConfig
from llamablock.lab.record import Claim
from llamablock.rope_scaling import rope_frequencies

TRAIN, TARGET, HEAD = 4096, 32768, 128
FACTOR = TARGET / TRAIN  # 8


def head_config(rope_scaling: dict | None = None, base: float = 10000.0) -> ModelConfig:
    return ModelConfig(vocab_size=2, d_model=HEAD, n_layers=1, n_heads=1, rope_theta=base,
                       max_seq_len=TRAIN, rope_scaling=rope_scaling)


def inv_freq(rope_scaling: dict | None = None, base: float = 10000.0) -> torch.Tensor:
    return rope_frequencies(head_config(rope_scaling, base))[0].double()


def claim_interpolation_crowds() -> Claim:
    plain, linear = inv_freq(), inv_freq({"rope_type": "linear", "factor": FACTOR})
    ratio = (plain / linear).tolist()
    c = Claim("15.2.interpolation-crowds", "15.2", "interpolation shrinks neighbours' angle in the fast pairs by the factor",
              FACTOR, measured=ratio[0], unit="angle between neighbours, before / after, fastest pair",
              tolerance="equal to the factor to 1e-6")
    return c.judge(all(abs(r - FACTOR) < 1e-6 * FACTOR for r in ratio),
                   f"linear interpolation by s = {FACTOR:g}: every pair's angle per token divided by exactly s "
                   f"(first pair {plain[0]:.4f} -> {linear[0]:.4f} rad/token); so adjacent tokens are 1/{FACTOR:g} "
                   "as far apart in the pairs that encode local order")


def claim_ntk_exponent() -> Claim:
    plain, ntk = inv_freq(), inv_freq({"rope_type": "ntk", "factor": FACTOR})
    slow, fast = float(plain[-1] / ntk[-1]), float(plain[0] / ntk[0])
    c = Claim("15.2.ntk-exponent", "15.2", "NTK base s^(d/(d-2)): slowest pair slower by exactly s, fastest unchanged",
              [FACTOR, 1.0], measured=[slow, fast], unit="slowdown of the slowest, fastest pair",
              tolerance="float32 frequencies: 1e-5 relative")
    return c.judge(abs(slow / FACTOR - 1) < 1e-5 and fast == 1.0,
                   f"d = {HEAD}, base 10000 -> {10000 * FACTOR ** (HEAD / (HEAD - 2)):,.0f}")


def claim_raise_base() -> Claim:
    low, high = inv_freq(base=10000.0), inv_freq(base=500000.0)
    c = Claim("15.2.raise-base", "15.2", "base 10,000 -> 500,000 leaves the first pair unchanged", 1.0,
              measured=float(high[0]), unit="rad/token, first pair", tolerance="exact")
    return c.judge(float(high[0]) == float(low[0]) == 1.0,
                   f"the slowest pair slows by {float(low[-1] / high[-1]):.1f}x (= 50^(126/128)); the pairs in "
                   "between by 50^(2i/d), so the slow end stretches most")


def claim_alibi_slopes() -> Claim:
    got = alibi_slopes(8).tolist()
    expected = [1 / 2**h for h in range(1, 9)]
    c = Claim("15.2.alibi-slopes", "15.2", "ALiBi slopes for 8 heads: 1/2, 1/4, ..., 1/256", "1/2 ... 1/256",
              measured=[f"1/{round(1 / s)}" for s in got], tolerance="exact")
    return c.judge(got == expected, "llamablock.alibi.alibi_slopes (Press et al.'s geometric sequence 2^(-8h/n))")


def run(quick: bool, out) -> list[Claim]:
    return [claim_interpolation_crowds(), claim_ntk_exponent(), claim_raise_base(), claim_alibi_slopes()]

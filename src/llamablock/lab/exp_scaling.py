"""Section 15.2: stretching RoPE from 4,096 trained tokens to 32,768, and ALiBi.

Frequencies come from `llamablock.rope_scaling.rope_frequencies` (the code the models run,
checked against transformers in the tests); each claim is a closed form of the module.
"""

from __future__ import annotations

import torch

from llamablock.alibi import alibi_slopes
from llamablock.diagnostics.rope_table import compare_methods
from llamablock.lab.record import Claim
from llamablock.rope_scaling import RopeSpec, rope_frequencies

TRAIN, TARGET, HEAD = 4096, 32768, 128
FACTOR = TARGET / TRAIN  # 8


# The ids of the claims this experiment records (for `llamablock lab --only`).
CLAIMS = (
    "15.2.unseen-pairs",
    "15.2.interpolation-crowds",
    "15.2.ntk-exponent",
    "15.2.raise-base",
    "15.2.alibi-slopes",
)


def inv_freq(rope_scaling: dict | None = None, base: float = 10000.0) -> torch.Tensor:
    """The frequencies of a head of width HEAD trained on TRAIN tokens, float64 for the ratios."""
    return rope_frequencies(RopeSpec(base, HEAD, TRAIN, rope_scaling))[0].double()


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


def claim_unseen_pairs() -> Claim:
    """Which of the 64 pairs reach angles unseen in training at 32,768 (rope_table's criterion:
    wavelength > L and the pair's view of the target, T / ratio, beyond L)."""
    res = {r["method"]: r for r in compare_methods(TRAIN, TARGET, HEAD)}
    unseen = {m: r["unseen_pairs"] for m, r in res.items()}
    crowded = {m: r["crowded_pairs"] for m, r in res.items()}
    first_slow = min(p["pair"] for p in res["default"]["pairs"] if p["wavelength"] > TRAIN)
    module_says = (unseen["default"] == list(range(first_slow, HEAD // 2)) and not unseen["linear"]
                   and len(crowded["linear"]) == first_slow and len(unseen["ntk"]) > 0
                   and not unseen["yarn"] and 0 not in crowded["yarn"])
    c = Claim("15.2.unseen-pairs", "15.2", "4,096 -> 32,768: only slow pairs unseen; NTK overshoots some; YaRN none",
              "slow only; NTK some; YaRN none",
              measured={m: len(v) for m, v in unseen.items()}, unit="pairs (of 64) reaching unseen angles",
              tolerance="the pattern, exactly")
    return c.judge(module_says, f"head width {HEAD}, base 10000. Unchanged: pairs {first_slow}-{HEAD // 2 - 1} "
                   f"(wavelength over 4,096 tokens) are unseen. Interpolation: none unseen, but all {len(crowded['linear'])} "
                   f"fast pairs crowded. NTK-aware: pairs {_ranges(unseen['ntk'])} still overshoot (every slow pair but the "
                   f"slowest, which NTK's exponent fixes exactly; the module's 'some middle pairs'). Dynamic NTK at 32,768: "
                   f"{_ranges(unseen['dynamic']) or 'none'}. YaRN: {_ranges(unseen['yarn']) or 'none'} unseen, "
                   f"{_ranges(crowded['yarn']) or 'none'} crowded, fastest pair untouched. LLaMA 3.1's rule: "
                   f"{_ranges(unseen['llama3']) or 'none'} unseen.")


def _ranges(pairs: list[int]) -> str:
    """[3, 4, 5, 9] -> '3-5, 9'."""
    out, start = [], None
    for i, p in enumerate(pairs):
        if start is None:
            start = p
        if i + 1 == len(pairs) or pairs[i + 1] != p + 1:
            out.append(f"{start}-{p}" if p != start else f"{p}")
            start = None
    return ", ".join(out)


def plot_pairs(out) -> list[str]:
    """The module's rope-scaling figure, drawn by the same code as `llamablock rope --plot`."""
    from pathlib import Path

    from llamablock.diagnostics.rope_plot import plot_wavelengths

    if out is None:
        return []
    res = dict(train_len=TRAIN, target_len=TARGET, head_dim=HEAD, base=10000.0,
               methods=compare_methods(TRAIN, TARGET, HEAD))
    plot_wavelengths(res, Path(out) / "rope-scaling.png")
    return ["rope-scaling.png"]


def run(quick: bool, out) -> list[Claim]:
    unseen = claim_unseen_pairs()
    unseen.plots = plot_pairs(out)
    return [unseen, claim_interpolation_crowds(), claim_ntk_exponent(), claim_raise_base(), claim_alibi_slopes()]

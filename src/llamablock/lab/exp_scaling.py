"""Section 15.2: stretching RoPE from 4,096 trained tokens to 32,768, and ALiBi.

Frequencies come from `llamablock.rope_scaling.rope_frequencies` (the code the models run,
checked against transformers in the tests) and the per-pair table of
`llamablock.diagnostics.rope_table`; slopes and biases from `llamablock.alibi`. Where the module
states a number the check compares with it; where it states a pattern in words (which pairs,
which heads) the check states the criterion it applies and the measured pattern beside it.
"""

from __future__ import annotations

import math

import torch

from llamablock import alibi as alibi_lib
from llamablock.diagnostics.rope_table import compare_methods, pair_records
from llamablock.lab.details_text import ranges, said
from llamablock.lab.record import Claim
from llamablock.rope import Rotary
from llamablock.rope_scaling import RopeSpec, rope_frequencies

TRAIN, TARGET, HEAD = 4096, 32768, 128
FACTOR = TARGET / TRAIN  # 8


# The ids of the claims this experiment records (for `llamablock lab --only`).
CLAIMS = (
    "15.2.unseen-pairs",
    "15.2.interpolation-crowds",
    "15.2.ntk-exponent",
    "15.2.ntk-wording",
    "15.2.yarn-logit-scale",
    "15.2.raise-base",
    "15.2.alibi-slopes",
    "15.2.alibi-near-far",
)


def inv_freq(rope_scaling: dict | None = None, base: float = 10000.0) -> torch.Tensor:
    """The frequencies of a head of width HEAD trained on TRAIN tokens, float64 for the ratios."""
    return rope_frequencies(RopeSpec(base, HEAD, TRAIN, rope_scaling))[0].double()


def _methods() -> dict[str, dict]:
    return {r["method"]: r for r in compare_methods(TRAIN, TARGET, HEAD)}


def claim_interpolation_crowds() -> Claim:
    plain, linear = inv_freq(), inv_freq({"rope_type": "linear", "factor": FACTOR})
    ratio = (plain / linear).tolist()
    c = Claim("15.2.interpolation-crowds", "15.2", "interpolation shrinks neighbours' angle in the fast pairs by the factor",
              FACTOR, measured=round(ratio[0], 6), unit="angle between neighbours, before / after, fastest pair",
              tolerance="every pair: equal to the factor to 1e-6")
    return c.judge(all(abs(r - FACTOR) < 1e-6 * FACTOR for r in ratio),
                   said("15.2.interpolation-crowds", factor=FACTOR, low=min(ratio), high=max(ratio),
                        before=float(plain[0]), after=float(linear[0])))


def claim_ntk_exponent() -> Claim:
    plain, ntk = inv_freq(), inv_freq({"rope_type": "ntk", "factor": FACTOR})
    slow, fast = float(plain[-1] / ntk[-1]), float(plain[0] / ntk[0])
    c = Claim("15.2.ntk-exponent", "15.2", "NTK base s^(d/(d-2)): slowest pair slower by exactly s, fastest unchanged",
              [FACTOR, 1.0], measured=[round(slow, 5), round(fast, 5)], unit="slowdown of the slowest, fastest pair",
              tolerance="float32 frequencies: 1e-5 relative")
    return c.judge(abs(slow / FACTOR - 1) < 1e-5 and fast == 1.0,
                   said("15.2.ntk-exponent", d=HEAD, base=10000 * FACTOR ** (HEAD / (HEAD - 2)), slow=slow, fast=fast))


def claim_ntk_wording() -> Claim:
    """The module's figure caption: NTK 'stretches only the slow end, though some middle pairs still
    overshoot'; its exercise: 'the fastest pair is untouched'. Criterion for 'only the slow end':
    no fast pair (more than 32 turns within the training length, YaRN's beta_fast) slowed by more
    than a tenth; for 'some': at most half of the slow pairs still reach unseen angles."""
    res = _methods()
    plain, ntk = inv_freq(), inv_freq({"rope_type": "ntk", "factor": FACTOR})
    slowdown = (plain / ntk).tolist()
    fast = [p["pair"] for p in res["default"]["pairs"] if p["rotations_in_training"] > 32]
    slow = [p["pair"] for p in res["default"]["pairs"] if p["wavelength"] > TRAIN]
    over = res["ntk"]["unseen_pairs"]
    worst_fast = max(slowdown[i] for i in fast)
    hurt = [i for i in fast if slowdown[i] > 1.1]
    c = Claim("15.2.ntk-wording", "15.2", "NTK-aware stretches only the slow end; some middle pairs still overshoot",
              "only the slow end stretched (caption); the fastest pair untouched (exercise); some overshoot",
              measured={"slow pairs still unseen": f"{len(over)} of {len(slow)}",
                        "fast pairs slowed > 1.1x": f"{len(hurt)} of {len(fast)}",
                        "largest fast-pair slowdown": round(worst_fast, 2),
                        "fastest pair's slowdown": round(slowdown[0], 6)},
              tolerance="fast pairs (> 32 turns in 4,096 tokens) slowed at most 1.1x; at most half the slow pairs unseen")
    ok = not hurt and len(over) <= len(slow) / 2
    lines = [said("15.2.ntk-wording", train=TRAIN, target=TARGET, d=HEAD, hurt=hurt, fast=fast, worst=worst_fast,
                  over=over, n_over=len(over), n_slow=len(slow), factor=FACTOR, first=slowdown[0])]
    if hurt:
        lines.append(said("15.2.ntk-wording fast", n_hurt=len(hurt), n_fast=len(fast)))
    if len(over) > len(slow) / 2:
        lines.append(said("15.2.ntk-wording some", n_over=len(over), n_slow=len(slow)))
    return c.judge(ok, *lines)


def claim_yarn_logit_scale() -> Claim:
    """YaRN multiplies cos and sin by 0.1 ln s + 1 (Peng et al., eq. for sqrt(1/t)), so every score
    q.k is multiplied by its square. Measured on a score through the library's Rotary."""
    spec = RopeSpec(10000.0, HEAD, TRAIN, {"rope_type": "yarn", "factor": FACTOR})
    plain, yarn = Rotary(RopeSpec(10000.0, HEAD, TRAIN), "half"), Rotary(spec, "half")
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(1, 1, 2, HEAD, generator=g).unbind(2)
    pos = torch.tensor([[0]])  # at position 0 the rotation is the identity: only the scale remains

    def score(rot):
        cos, sin = rot.cos_sin(pos, torch.float64)
        return float((rot.rotate(q[:, :, None].double(), cos, sin) * rot.rotate(k[:, :, None].double(), cos, sin)).sum())

    measured = score(yarn) / score(plain)
    paper = (0.1 * math.log(FACTOR) + 1) ** 2
    c = Claim("15.2.yarn-logit-scale", "15.2", "YaRN scales the logits up slightly", "slightly up",
              measured=round(measured, 4), unit="score with YaRN / without, s = 8",
              tolerance=f"(0.1 ln s + 1)^2 = {paper:.4f} (Peng et al.) to 1e-5, and above 1")
    return c.judge(abs(measured - paper) < 1e-5 and measured > 1,
                   said("15.2.yarn-logit-scale", root=math.sqrt(measured), factor=FACTOR, measured=measured,
                        sharpen=measured - 1))


def claim_raise_base() -> Claim:
    low, high = inv_freq(base=10000.0), inv_freq(base=500000.0)
    stretch = (low / high).tolist()
    c = Claim("15.2.raise-base", "15.2", "base 10,000 -> 500,000 leaves the first pair unchanged, slowest stretch most",
              1.0, measured=float(high[0]), unit="rad/token, first pair", tolerance="holds by the formula base^(-2i/d)")
    return c.define(said("15.2.raise-base", slowest=stretch[-1], d=HEAD, d_minus_2=HEAD - 2))


def claim_alibi_slopes() -> Claim:
    got = alibi_lib.alibi_slopes(8).tolist()
    expected = [1 / 2**h for h in range(1, 9)]
    c = Claim("15.2.alibi-slopes", "15.2", "ALiBi slopes for 8 heads: 1/2, 1/4, ..., 1/256", "1/2 ... 1/256",
              measured=", ".join(f"1/{1 / s:g}" for s in got), tolerance="exact")
    return c.judge(got == expected, said("15.2.alibi-slopes"))


def claim_alibi_near_far() -> Claim:
    """With equal content scores, where does each head look? Mean attended distance of the last
    query of 1,024 tokens under the library's ALiBi bias alone. Criterion (the module states no
    number): the nearest head within 4 tokens, the farthest beyond 100."""
    t = 1024
    pos = torch.arange(t)
    bias = alibi_lib.ALiBi(8).bias(pos[-1:], pos)[:, 0]  # (h, s): the last query's row
    probs = torch.softmax(bias.double(), -1)
    mean_dist = (probs * (t - 1 - pos).double()).sum(-1).tolist()
    c = Claim("15.2.alibi-near-far", "15.2", "with slopes 1/2 .. 1/256 some heads focus nearby, others look far back",
              "near and far", measured=", ".join(f"{d:.1f}" for d in mean_dist),
              unit="mean attended distance per head, tokens (content scores equal)",
              tolerance="nearest head < 4 tokens, farthest > 100 tokens")
    return c.judge(min(mean_dist) < 4 and max(mean_dist) > 100,
                   said("15.2.alibi-near-far", keys=t, first=mean_dist[0], heads=len(mean_dist),
                        slowest=2.0 ** len(mean_dist), last=mean_dist[-1]))


def regions(pairs: list[dict], factor: float, untouched, interpolated) -> dict:
    """Whether a per-pair scaling has the three regions the module describes: ratio exactly 1 where
    `untouched(pair)`, exactly `factor` where `interpolated(pair)`, strictly between and never
    decreasing from fast to slow in the blend. Exact to 1e-6 relative (float32 frequencies)."""
    ratios = [p["interpolation_ratio"] for p in pairs]
    fast = [p for p in pairs if untouched(p)]
    slow = [p for p in pairs if interpolated(p)]
    blend = [p for p in pairs if not untouched(p) and not interpolated(p)]
    ok = (all(abs(p["interpolation_ratio"] - 1) <= 1e-6 for p in fast)
          and all(abs(p["interpolation_ratio"] - factor) <= 1e-6 * factor for p in slow)
          and all(1 < p["interpolation_ratio"] < factor for p in blend)
          and all(b >= a * (1 - 1e-6) for a, b in zip(ratios, ratios[1:], strict=False)))
    return {"ok": ok and bool(fast) and bool(slow), "fast": [p["pair"] for p in fast], "slow": [p["pair"] for p in slow],
            "blend": [p["pair"] for p in blend]}


# LLaMA 3.1's own setting (Meta's config): base 500,000, trained 8,192, run to 131,072, factor 8,
# low_freq_factor 1, high_freq_factor 4.
LLAMA31 = dict(base=500000.0, train=8192, target=131072,
               scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                        "original_max_position_embeddings": 8192})


def claim_unseen_pairs() -> Claim:
    """Which of the 64 pairs reach angles unseen in training at 32,768 (rope_table's criterion:
    wavelength > L and the pair's view of the target, T / ratio, beyond L). The expected set for the
    unchanged model is the closed form: wavelength 2 pi 10000^(2i/d) > 4,096. YaRN's three regions
    are judged on the pairs' turns in L (Peng et al.: more than beta_fast = 32 untouched, fewer than
    beta_slow = 1 fully interpolated, a monotone blend between), and LLaMA 3.1's rescaling on its
    own setting (8,192 -> 131,072: wavelength under 8,192 / 4 untouched, over 8,192 divided by 8,
    a monotone blend between)."""
    res = _methods()
    unseen = {m: r["unseen_pairs"] for m, r in res.items()}
    crowded = {m: r["crowded_pairs"] for m, r in res.items()}
    closed = [i for i in range(HEAD // 2) if 2 * math.pi * 10000 ** (2 * i / HEAD) > TRAIN]
    yarn = regions(res["yarn"]["pairs"], FACTOR, lambda p: TRAIN / p["wavelength"] > 32,
                   lambda p: TRAIN / p["wavelength"] < 1)
    l3 = LLAMA31
    rows, _ = pair_records(RopeSpec(l3["base"], HEAD, l3["train"], l3["scaling"]), l3["train"], l3["target"])
    llama = regions(rows, 8.0, lambda p: p["wavelength"] < l3["train"] / 4, lambda p: p["wavelength"] > l3["train"])
    llama_unseen = [p["pair"] for p in rows if p["unseen_at_target"]]
    module_says = (unseen["default"] == closed and not unseen["linear"] and not unseen["yarn"]
                   and 0 not in crowded["yarn"] and yarn["ok"] and llama["ok"])
    c = Claim("15.2.unseen-pairs", "15.2", "4,096 -> 32,768: only slow pairs reach unseen angles; YaRN none",
              "slow only; interpolation and YaRN none",
              measured={m: ranges(v) or "none" for m, v in unseen.items()}, unit="pairs (of 64) reaching unseen angles",
              tolerance="unchanged: exactly the pairs with wavelength > 4,096; linear and YaRN: none; YaRN's and "
                        "LLaMA 3.1's three regions exact to 1e-6")
    return c.judge(module_says, said(
        "15.2.unseen-pairs", head=HEAD, default=unseen["default"], closed=closed, train=TRAIN, linear=unseen["linear"],
        linear_crowded=len(crowded["linear"]), target=TARGET, dynamic=unseen["dynamic"], yarn=unseen["yarn"],
        yarn_crowded=crowded["yarn"], yarn_fast=yarn["fast"], yarn_blend=yarn["blend"], yarn_slow=yarn["slow"],
        yarn_ok=yarn["ok"], llama3=unseen["llama3"], l3_fast=llama["fast"], l3_blend=llama["blend"],
        l3_slow=llama["slow"], l3_ok=llama["ok"], l3_unseen=llama_unseen))




def plot_pairs(out) -> list[str]:
    """The module's rope-scaling figure, drawn on the unseen-angle criterion's own quantity, so that
    its circles and threshold follow the table (lab.plots.plot_unseen)."""
    from llamablock.lab.plots import plot_unseen

    if out is None:
        return []
    return plot_unseen(compare_methods(TRAIN, TARGET, HEAD), TRAIN, TARGET, out)


def run(quick: bool, out) -> list[Claim]:
    unseen = claim_unseen_pairs()
    unseen.plots = plot_pairs(out)
    return [unseen, claim_interpolation_crowds(), claim_ntk_exponent(), claim_ntk_wording(), claim_yarn_logit_scale(),
            claim_raise_base(), claim_alibi_slopes(), claim_alibi_near_far()]

"""Beyond the module: the two changes its descendants made to the 2024 block, trained like the rest.

Neither is a claim of the module; each is the claim its authors made, measured the way the lab's
own 15.6.training-stability is (llamablock.lab.exp_training): the 2024 block with and without the
change, at the ablation's learning rate and again at ten times it with a short warm-up.

    q/k norm        RMSNorm over each head's queries and keys before RoPE (Qwen3, Gemma 3): keeps the
                    attention logits from growing, the instability Dehghani et al. (2023) met at 22B
                    parameters and Wortsman et al. (2023) reproduced in small models at high learning rates.
    sandwich norms  a second RMSNorm on each sub-layer's output before the add (Gemma 2 and 3; CogView's
                    sandwich-LN, Ding et al. 2021): bounds what each block adds to the stream.

The verdict needs the baseline to suffer first: when the 2024 block loses no more than the noise at
the high rate, there is nothing for the change to fix and the claim is not measurable here. These
claims are counted apart from the module's in the report's headline.
"""

from __future__ import annotations

from llamablock.lab.exp_training import (
    FULL,
    INDICATIVE,
    QUICK,
    _loss,
    _row,
    run_variants,
)
from llamablock.lab.record import Claim
from llamablock.studies import ablation

CLAIMS = ("beyond.qk-norm", "beyond.sandwich-norm")
CHANGES = {
    "beyond.qk-norm": ("2024 + q/k norm", "q/k norm keeps training stable at a learning rate that hurts the block "
                       "without it (Dehghani et al. 2023; Wortsman et al. 2023)"),
    "beyond.sandwich-norm": ("2024 + sandwich norms", "a norm after each sub-layer as well stabilises training at a "
                             "high learning rate (Ding et al. 2021; Gemma 2)"),
}


def run(quick: bool, out) -> list[Claim]:
    p = QUICK if quick else FULL
    names = ("2024",) + tuple(v for v, _ in CHANGES.values())
    calm = ablation.summarize(run_variants(p["steps"], p["seeds"], p["size"], p["context"], names=names))
    hot = ablation.summarize(run_variants(p["steps"], p["seeds"], p["size"], p["context"], names=names,
                                          lr=1e-2, warmup=0.1))
    claims = [judge(cid, calm, hot) for cid in CLAIMS]
    if quick:
        for c in claims:
            c.indicative = INDICATIVE
    return claims


def judge(cid: str, calm: list[dict], hot: list[dict]) -> Claim:
    """The change's rise in loss at lr 1e-2 (against lr 1e-3) beside the 2024 block's."""
    variant, statement = CHANGES[cid]
    rise = {n: _row(hot, n)["val_loss"] - _row(calm, n)["val_loss"] for n in ("2024", variant)}
    one = _row(hot, "2024")["seeds"] < 2
    noise = 0.02 if one else max(2 * max(_row(t, n)["val_std"] for t in (calm, hot) for n in ("2024", variant)), 0.01)
    c = Claim(cid, "beyond", statement, "more stable", measured=[round(rise["2024"], 4), round(rise[variant], 4)],
              unit=f"val loss rise at lr 1e-2 with a short warm-up, 2024 / {variant}, nats/char",
              tolerance="the change's rise smaller than the 2024 block's by more than the noise")
    quality = _row(calm, variant)["val_loss"] - _row(calm, "2024")["val_loss"]
    text = (f"at lr 1e-3: 2024 {_loss(_row(calm, '2024'))}, {variant} {_loss(_row(calm, variant))} ({quality:+.4f}); "
            f"at lr 1e-2 with warm-up over 10% of the steps: 2024 {_loss(_row(hot, '2024'))} ({rise['2024']:+.4f}), "
            f"{variant} {_loss(_row(hot, variant))} ({rise[variant]:+.4f}); noise threshold {noise:.3f}.")
    if rise["2024"] <= noise:
        return c.unmeasurable(text + " The 2024 block itself loses no more than the noise at the high rate here, so "
                              "there is no instability for the change to remove at this size and depth.")
    ok = rise[variant] < rise["2024"] - noise
    return c.judge(ok, text + ("" if ok else " The instability these changes address grows with width, depth and "
                               "training length; at this size the change does not remove what the high rate costs."))

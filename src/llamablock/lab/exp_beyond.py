"""Beyond the module: the two changes its descendants made to the 2024 block, trained like the rest.

Neither is a claim of the module; each is the claim its authors made, measured the way the lab's
own 15.6.training-stability is (llamablock.lab.exp_training): the 2024 block with and without the
change, at the ablation's learning rate and again at ten times it with a short warm-up.

    q/k norm        RMSNorm over each head's queries and keys before RoPE (Qwen3, Gemma 3): keeps the
                    attention logits from growing, the instability Dehghani et al. (2023) met at 22B
                    parameters and Wortsman et al. (2023) reproduced in small models at high learning rates.
    sandwich norms  a second RMSNorm on each sub-layer's output before the add (Gemma 2 and 3; CogView's
                    sandwich-LN, Ding et al. 2021): bounds what each block adds to the stream.

And the cache of windowed layers (Mistral; Gemma's local layers): `KVCache` keeps a ring of W slots
for each, so a 32k-token Gemma 3 context does not hold the whole context in every layer
(which would take about six times the cache it needs); counted on the meta device, with the calculator beside it.

The training verdicts need the baseline to suffer first: when the 2024 block loses no more than the noise at
the high rate, there is nothing for the change to fix and the claim is not measurable here. These
claims are counted apart from the module's in the report's headline.
"""

from __future__ import annotations

import torch

from llamablock.diagnostics.kv_calculator import kv_cache_size
from llamablock.kv_cache import KVCache
from llamablock.lab.details_text import said
from llamablock.lab.record import Claim
from llamablock.lab.shared import (
    FULL,
    INDICATIVE,
    QUICK,
    _loss,
    _row,
    run_variants,
)
from llamablock.lab.shared import noise as shared_noise
from llamablock.presets import preset
from llamablock.studies import ablation
from llamablock.util.units import human_bytes

CLAIMS = ("beyond.window-cache", "beyond.qk-norm", "beyond.sandwich-norm")
CHANGES = {
    "beyond.qk-norm": ("2024 + q/k norm", "q/k norm keeps training stable at a learning rate that hurts the block "
                       "without it (Dehghani et al. 2023; Wortsman et al. 2023)"),
    "beyond.sandwich-norm": ("2024 + sandwich norms", "a norm after each sub-layer as well stabilises training at a "
                             "high learning rate (Ding et al. 2021; Gemma 2)"),
}


def claim_window_cache(tokens: int = 32768) -> Claim:
    """Gemma 3 4B at 32k tokens, bf16: every layer at the whole context against a ring per windowed layer."""
    cfg = preset("gemma-3-4b")
    ring = KVCache(cfg, 1, tokens, torch.bfloat16, "meta").nbytes()
    whole = KVCache(cfg.replace(sliding_window=None, layer_types=None, local_rope_theta=None), 1, tokens,
                    torch.bfloat16, "meta").nbytes()
    calc = kv_cache_size(cfg, tokens, dtype="bfloat16").total_bytes
    kinds = cfg.layer_kinds
    c = Claim("beyond.window-cache", "beyond", "a 32k-token Gemma 3 context needs about a sixth of the cache of one "
              "that keeps the whole context in every layer", "about 6x", measured=round(whole / ring, 2),
              unit="KVCache bytes, whole context / ring per windowed layer", tolerance="5x to 7x, calculator equal")
    return c.judge(5 <= whole / ring <= 7 and calc == ring,
                   said("beyond.window-cache", full=kinds.count("full"), local=kinds.count("sliding"),
                        window=cfg.sliding_window, tokens=tokens, whole=human_bytes(whole), ring=human_bytes(ring),
                        calc=human_bytes(calc)))


def run(quick: bool, out) -> list[Claim]:
    claims = [claim_window_cache()]
    p = QUICK if quick else FULL
    names = ("2024",) + tuple(v for v, _ in CHANGES.values())
    calm_records = run_variants(p["steps"], p["seeds"], p["size"], p["context"], names=names)
    calm = ablation.summarize(calm_records)
    hot_records = run_variants(p["steps"], p["seeds"], p["size"], p["context"], names=names, lr=1e-2, warmup=0.1)
    hot = ablation.summarize(hot_records)
    trained = [judge(cid, (calm_records, calm), (hot_records, hot)) for cid in CHANGES]
    if quick:
        for c in trained:
            c.indicative = [INDICATIVE]
    return claims + trained


def judge(cid: str, calm_run: tuple[list[dict], list[dict]], hot_run: tuple[list[dict], list[dict]]) -> Claim:
    """The change's rise in loss at lr 1e-2 (against lr 1e-3) beside the 2024 block's; each run is
    (records, summary)."""
    (calm_records, calm), (hot_records, hot) = calm_run, hot_run
    variant, statement = CHANGES[cid]
    rise = {n: _row(hot, n)["val_loss"] - _row(calm, n)["val_loss"] for n in ("2024", variant)}
    noise, how = shared_noise([(hot_records, hot, "2024", 1), (calm_records, calm, "2024", -1),
                               (hot_records, hot, variant, -1), (calm_records, calm, variant, 1)])
    base_noise, _ = shared_noise([(hot_records, hot, "2024", 1), (calm_records, calm, "2024", -1)])
    c = Claim(cid, "beyond", statement, "more stable", measured=[round(rise["2024"], 4), round(rise[variant], 4)],
              unit=f"val loss rise at lr 1e-2 with a short warm-up, 2024 / {variant}, nats/char",
              tolerance="the change's rise smaller than the 2024 block's by more than the noise")
    quality = _row(calm, variant)["val_loss"] - _row(calm, "2024")["val_loss"]
    text = said("beyond.training", calm=_loss(_row(calm, "2024")), variant=variant, calm_variant=_loss(_row(calm, variant)),
                quality=quality, hot=_loss(_row(hot, "2024")), rise=rise["2024"], hot_variant=_loss(_row(hot, variant)),
                variant_rise=rise[variant], noise=noise, base_noise=base_noise)
    if rise["2024"] <= base_noise:
        return c.unmeasurable(text, how, said("beyond.training no instability"))
    ok = rise[variant] < rise["2024"] - noise
    return c.judge(ok, text, how, *([] if ok else [said("beyond.training not removed")]))

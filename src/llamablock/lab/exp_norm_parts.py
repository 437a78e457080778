"""15.3, Zhang & Sennrich's argument: LayerNorm's mean subtraction is not what keeps training stable;
the division that fixes the scale is.

The 2017 block (post-LN LayerNorm, the ablation's `shared.lab_variants` "2017" model) trained three
ways, each LayerNorm replaced by one of: itself; the same without the mean subtraction (x / RMS(x),
gain and shift kept); the same without the division ((x - mean(x)), gain and shift kept). Training
is the library's recipe (init_weights, make_optimizer, lr_at, sample_batch, clipped gradients) in a
short loop here, because train() builds its model from the config and the config names only whole
norms; a run whose loss turns non-finite is recorded as diverged.

The precondition, checked on every run: LayerNorm trains at this rate, read as each seed's loss
ending below the loss of the character frequencies alone (each character predicted by its share of
the training text, `unigram_losses`) by more than twice the standard error over the evaluation
windows. Falling below the loss at initialisation is not enough: a post-LN model stuck at the
character frequencies has learnt nothing a norm could keep stable, and at 15.6.training-stability's
1e-2 (or with its short warm-up at 1e-3) the 2017 block stays there at the lab's sizes, in some
seeds or all. So the recipe is the ablation's, lr 1e-3 warmed up over 40% of the steps, the one
every other trained claim of the 2017 block uses.

Sizes (PARTS_RUN), chosen so the verdict keeps its power at a fraction of the ablation's cost: the
full run keeps the ablation's 200 steps, three seeds and 4 blocks, at width 64 and context 64 (the
quick run's) instead of 128 and 128. Depth and steps are what the claim needs: a post-LN block
without its division passes its scale on to the next, so a missing division compounds block by
block and step by step, and needs the blocks and the whole run to show; width and context only
make each step dearer, adding no block for the scale to compound through. Three seeds put the
spread between seeds into the noise, so each change is judged against seed-to-seed variation, not
one draw, and every seed must meet the precondition; 32 evaluation windows per seed give the
paired window noise. The quick run trains one seed of the quick ablation's 2-layer model.

Judged against LayerNorm on the noise of `shared.noise`: reproduced when removing the division hurts
(a loss higher beyond the noise, or divergence) and removing the mean does not; differs when
removing the mean hurts or removing the division does not.
"""

from __future__ import annotations

import dataclasses
import math
import statistics

import torch
from torch import nn

from llamablock.lab.details_text import said
from llamablock.lab.record import Claim
from llamablock.lab.shared import FULL, QUICK, _row, lab_variants, window_losses
from llamablock.lab.shared import noise as shared_noise
from llamablock.model import Decoder
from llamablock.runtime.evaluate import lm_loss
from llamablock.studies import ablation
from llamablock.training import data as D
from llamablock.training.train import TrainConfig, get_data, init_weights, lr_at, make_optimizer

CLAIMS = ("15.3.division-stabilizes",)
LR, WARMUP = 1e-3, 0.4  # the ablation's rate and warm-up, at which the 2017 block trains
PARTS_RUN = {True: QUICK, False: dict(FULL, context=QUICK["context"], size=dict(QUICK["size"], n_layers=4))}


class PartNorm(nn.LayerNorm):
    """LayerNorm with its mean subtraction or its division by the standard deviation switched off."""

    def __init__(self, dim: int, eps: float, centre: bool, divide: bool):
        super().__init__(dim, eps=eps)
        self.centre, self.divide = centre, divide

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x - x.mean(-1, keepdim=True) if self.centre else x
        if self.divide:
            y = y * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + self.eps)
        return y * self.weight + self.bias


PARTS = {"LayerNorm": (True, True), "no mean subtraction": (False, True), "no division": (True, False)}


def with_norms(model: Decoder, centre: bool, divide: bool) -> Decoder:
    """`model` with every LayerNorm replaced by a PartNorm of the same width (fresh gain 1, shift 0)."""
    for module in list(model.modules()):
        for child, sub in list(module.named_children()):
            if isinstance(sub, nn.LayerNorm):
                setattr(module, child, PartNorm(sub.normalized_shape[0], sub.eps, centre, divide))
    return model


def unigram_losses(train: torch.Tensor, windows: torch.Tensor, vocab: int) -> torch.Tensor:
    """(n,) mean loss of each window's next tokens predicted by the training text's character
    frequencies alone (add-one smoothed, so a character the training text lacks costs a finite loss)."""
    p = (torch.bincount(train, minlength=vocab).double() + 1) / (len(train) + vocab)
    return -p.log()[windows[:, 1:]].mean(-1)


def train_part(name: str, cfg, t: TrainConfig) -> dict:
    """One run in the ablation's record format, with the loss at initialisation and the character
    frequencies' loss on the same windows; val_loss inf and no window losses when it diverged."""
    data = get_data(t)
    torch.manual_seed(t.seed)
    model = Decoder(cfg)
    init_weights(model)
    model = with_norms(model, *PARTS[name])
    windows = D.eval_windows(data.val, t.context, t.eval_windows)
    start = float(window_losses(model, windows).mean())
    opt = make_optimizer(model, t)
    record = {"variant": name, "seed": t.seed, "tokens_per_s": 0.0, "params": model.num_parameters(), "d_ff": cfg.d_ff,
              "kv_bytes_per_token": cfg.kv_bytes_per_token(2), "start_loss": start,
              "unigram_losses": unigram_losses(data.train, windows, cfg.vocab_size).tolist()}
    with torch.enable_grad():
        model.train()
        for step in range(t.steps):
            for group in opt.param_groups:
                group["lr"] = lr_at(step, t)
            loss = lm_loss(model, D.sample_batch(data.train, t.batch_size, t.context, t.seed, step))
            opt.zero_grad(set_to_none=True)
            loss.backward()
            norm = float(torch.nn.utils.clip_grad_norm_(model.parameters(), t.grad_clip))
            if not (math.isfinite(float(loss.detach())) and math.isfinite(norm)):
                return record | {"val_loss": math.inf, "diverged_at": step + 1}
            opt.step()
    losses = window_losses(model, windows)
    if not bool(torch.isfinite(losses).all()):
        return record | {"val_loss": math.inf, "diverged_at": t.steps}
    return record | {"val_loss": float(losses.mean()), "window_losses": losses.tolist()}


def run_parts(quick: bool) -> list[dict]:
    p = PARTS_RUN[quick]
    base = TrainConfig(steps=p["steps"], batch_size=16, context=p["context"], lr=LR, warmup=round(WARMUP * p["steps"]),
                       eval_every=p["steps"], eval_windows=32)
    cfg = lab_variants(get_data(base).tokenizer.vocab_size, p["context"], p["size"])["2017"]
    return [train_part(name, cfg, dataclasses.replace(base, seed=seed)) for seed in p["seeds"] for name in PARTS]


def trains(records: list[dict]) -> tuple[bool, dict]:
    """Whether LayerNorm trains in every seed: each seed's per-window loss minus the character
    frequencies' on the same windows below 0 by more than twice its standard error over the windows
    (never when a LayerNorm run diverged); and the seed closest to not training (seed, loss, the
    frequencies' loss, margin)."""
    seeds = []
    for r in (r for r in records if r["variant"] == "LayerNorm"):
        unigram = statistics.fmean(r["unigram_losses"])
        if "window_losses" not in r:
            return False, {"seed": r["seed"], "ln": math.inf, "unigram": unigram, "noise": 0.0}
        gaps = [a - b for a, b in zip(r["window_losses"], r["unigram_losses"], strict=True)]
        margin = 2 * statistics.stdev(gaps) / math.sqrt(len(gaps)) if len(gaps) > 1 else math.inf
        seeds.append((statistics.fmean(gaps) + margin, {"seed": r["seed"], "ln": r["val_loss"], "unigram": unigram,
                                                        "noise": margin}))
    worst = max(seeds, key=lambda s: s[0])
    return worst[0] < 0, worst[1]


def judge(records: list[dict], steps: int) -> Claim:
    c = Claim("15.3.division-stabilizes", "15.3", "the division by the RMS, not the mean subtraction, keeps training "
              "stable (Zhang & Sennrich)", "division", unit=f"val loss minus LayerNorm's at lr {LR:g}, 2017 block: "
              "no mean subtraction / no division, nats/char",
              tolerance="removing the division raises the loss beyond the noise (or diverges) and removing the mean "
                        "does not; the precondition: LayerNorm trains at this rate (below the character frequencies' "
                        "loss beyond the noise)")
    diverged = {r["variant"] for r in records if not math.isfinite(r["val_loss"])}
    finite = [r for r in records if r["variant"] not in diverged]
    summary = ablation.summarize(finite) if finite else []
    fell, worst = trains(records)
    seeds = len({r["seed"] for r in records})
    ln = [r for r in records if r["variant"] == "LayerNorm"]

    def change(name: str) -> tuple[float, float, dict | None]:
        if name in diverged:
            return math.inf, 0.0, None
        noise, how = shared_noise([(finite, summary, name, 1), (finite, summary, "LayerNorm", -1)])
        return _row(summary, name)["val_loss"] - _row(summary, "LayerNorm")["val_loss"], noise, how

    c.table = [{"variant": r["variant"], "seed": r["seed"], "loss at init": round(r["start_loss"], 4),
                "character frequencies": round(statistics.fmean(r["unigram_losses"]), 4),
                "val loss": round(r["val_loss"], 4) if math.isfinite(r["val_loss"]) else "diverged"} for r in records]
    if not fell:
        return c.unmeasurable(said("15.3.division-stabilizes no training", steps=steps, lr=LR, **worst))
    (mean_d, mean_n, how), (div_d, div_n, _) = change("no mean subtraction"), change("no division")
    c.measured = [round(mean_d, 4), round(div_d, 4) if math.isfinite(div_d) else "diverged"]
    common = dict(steps=steps, lr=LR, warmup=WARMUP, seeds=seeds, ln=statistics.fmean(r["val_loss"] for r in ln),
                  unigram=statistics.fmean(x for r in ln for x in r["unigram_losses"]), mean=mean_d, mean_noise=mean_n)
    lines = [said("15.3.division-stabilizes", division=div_d, division_noise=div_n, **common)
             if math.isfinite(div_d) else said("15.3.division-stabilizes diverged", **common)]
    lines += [how] if how else []  # no noise when removing the mean diverged
    mean_hurts, div_hurts = mean_d > mean_n, div_d > div_n
    if mean_hurts:
        lines.append(said("15.3.division-stabilizes mean"))
    if not div_hurts:
        lines.append(said("15.3.division-stabilizes division"))
    return c.judge(div_hurts and not mean_hurts, *lines)


def run(quick: bool, out) -> list[Claim]:
    c = judge(run_parts(quick), PARTS_RUN[quick]["steps"])
    if quick:
        q, full = PARTS_RUN[True], PARTS_RUN[False]
        c.indicative = [said("quick trained", steps=q["steps"], layers=q["size"]["n_layers"], width=q["size"]["d_model"],
                             full_layers=full["size"]["n_layers"], full_width=full["size"]["d_model"],
                             full_steps=full["steps"], full_seeds=len(full["seeds"]))]
    return [c]

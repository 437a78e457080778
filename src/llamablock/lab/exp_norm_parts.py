"""15.3, Zhang & Sennrich's argument: LayerNorm's mean subtraction is not what keeps training stable;
the division that fixes the scale is.

The 2017 block (post-LN LayerNorm, the ablation's `shared.lab_variants` "2017" model) trained three
ways, each LayerNorm replaced by one of: itself; the same without the mean subtraction (x / RMS(x),
gain and shift kept); the same without the division ((x - mean(x)), gain and shift kept). All at
the learning rate of 15.6.training-stability (1e-2, warm-up over a tenth of the steps), which the
2017 block trains at: the precondition is that LayerNorm's own loss falls below its loss at
initialisation. Training is the library's recipe (init_weights, make_optimizer, lr_at, sample_batch,
clipped gradients) in a short loop here, because train() builds its model from the config and
the config names only whole norms; a run whose loss turns non-finite is recorded as diverged.

Judged against LayerNorm on the paired window noise (`shared.noise`): reproduced when removing
the division hurts (a loss higher beyond the noise, or divergence) and removing the mean does not;
differs when removing the mean hurts or removing the division does not.
"""

from __future__ import annotations

import dataclasses
import math

import torch
from torch import nn

from llamablock.lab.details_text import said
from llamablock.lab.record import Claim
from llamablock.lab.shared import FULL, INDICATIVE, QUICK, _row, lab_variants, window_losses
from llamablock.lab.shared import noise as shared_noise
from llamablock.model import Decoder
from llamablock.runtime.evaluate import lm_loss
from llamablock.studies import ablation
from llamablock.training import data as D
from llamablock.training.train import TrainConfig, get_data, init_weights, lr_at, make_optimizer

CLAIMS = ("15.3.division-stabilizes",)
LR, WARMUP = 1e-2, 0.1  # 15.6.training-stability's rate, at which the 2017 block trains


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


def train_part(name: str, cfg, t: TrainConfig) -> dict:
    """One run in the ablation's record format; val_loss inf and no window losses when it diverged."""
    data = get_data(t)
    torch.manual_seed(t.seed)
    model = Decoder(cfg)
    init_weights(model)
    model = with_norms(model, *PARTS[name])
    windows = D.eval_windows(data.val, t.context, t.eval_windows)
    start = float(window_losses(model, windows).mean())
    opt = make_optimizer(model, t)
    record = {"variant": name, "seed": t.seed, "tokens_per_s": 0.0, "params": model.num_parameters(), "d_ff": cfg.d_ff,
              "kv_bytes_per_token": cfg.kv_bytes_per_token(2), "start_loss": start}
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
    p = QUICK if quick else FULL
    base = TrainConfig(steps=p["steps"], batch_size=16, context=p["context"], lr=LR, warmup=round(WARMUP * p["steps"]),
                       eval_every=p["steps"], eval_windows=32)
    cfg = lab_variants(get_data(base).tokenizer.vocab_size, p["context"], p["size"])["2017"]
    return [train_part(name, cfg, dataclasses.replace(base, seed=seed)) for seed in p["seeds"] for name in PARTS]


def judge(records: list[dict], steps: int) -> Claim:
    c = Claim("15.3.division-stabilizes", "15.3", "the division by the RMS, not the mean subtraction, keeps training "
              "stable (Zhang & Sennrich)", "division", unit="val loss minus LayerNorm's at lr 1e-2, 2017 block: "
              "no mean subtraction / no division, nats/char",
              tolerance="removing the division raises the loss beyond the noise (or diverges) and removing the mean "
                        "does not; the precondition: LayerNorm trains at this rate")
    diverged = {r["variant"] for r in records if not math.isfinite(r["val_loss"])}
    finite = [r for r in records if r["variant"] not in diverged]
    summary = ablation.summarize(finite) if finite else []
    ln = [r for r in records if r["variant"] == "LayerNorm"]
    fell = "LayerNorm" not in diverged and max(r["val_loss"] - r["start_loss"] for r in ln) < 0

    def change(name: str) -> tuple[float, float]:
        if name in diverged:
            return math.inf, 0.0
        noise, _ = shared_noise([(finite, summary, name, 1), (finite, summary, "LayerNorm", -1)])
        return _row(summary, name)["val_loss"] - _row(summary, "LayerNorm")["val_loss"], noise

    c.table = [{"variant": r["variant"], "seed": r["seed"], "loss at init": round(r["start_loss"], 4),
                "val loss": round(r["val_loss"], 4) if math.isfinite(r["val_loss"]) else "diverged"} for r in records]
    if not fell:
        return c.unmeasurable(said("15.3.division-stabilizes no training", steps=steps, lr=LR))
    (mean_d, mean_n), (div_d, div_n) = change("no mean subtraction"), change("no division")
    c.measured = [round(mean_d, 4), round(div_d, 4) if math.isfinite(div_d) else "diverged"]
    common = dict(steps=steps, lr=LR, warmup=WARMUP, mean=mean_d, mean_noise=mean_n)
    lines = [said("15.3.division-stabilizes", division=div_d, division_noise=div_n, **common)
             if math.isfinite(div_d) else said("15.3.division-stabilizes diverged", **common)]
    mean_hurts, div_hurts = mean_d > mean_n, div_d > div_n
    if mean_hurts:
        lines.append(said("15.3.division-stabilizes mean"))
    if not div_hurts:
        lines.append(said("15.3.division-stabilizes division"))
    return c.judge(div_hurts and not mean_hurts, *lines)


def run(quick: bool, out) -> list[Claim]:
    c = judge(run_parts(quick), (QUICK if quick else FULL)["steps"])
    if quick:
        c.indicative = [INDICATIVE]
    return [c]

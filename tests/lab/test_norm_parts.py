"""15.3.division-stabilizes (lab/exp_norm_parts.py): the two halves of LayerNorm as layers, and the
verdict on synthetic runs: reproduced where only removing the division hurts, differs where removing
the mean hurts or removing the division does not, not measurable where LayerNorm itself does not train
(it ends no lower than the character frequencies alone, or diverges)."""

import math

import torch
import torch.nn.functional as F
from test_lab import _broken

from llamablock.lab import exp_norm_parts as x
from llamablock.lab.record import NOT_MEASURABLE, REPRODUCED


def test_part_norms_are_layernorm_without_one_part():
    v = torch.randn(4, 16) * 3 + 1
    full, no_mean, no_div = (x.PartNorm(16, 1e-5, *x.PARTS[n]) for n in ("LayerNorm", "no mean subtraction",
                                                                        "no division"))
    assert torch.allclose(full(v), F.layer_norm(v, (16,), eps=1e-5), atol=1e-5)
    assert torch.allclose(no_mean(v), v * torch.rsqrt(v.pow(2).mean(-1, keepdim=True) + 1e-5), atol=1e-6)
    assert torch.allclose(no_div(v), v - v.mean(-1, keepdim=True), atol=1e-6)


def _runs(mean_change=0.0, div_change=0.3, start=4.0, ln=3.0, unigram=3.3, diverged=(), stuck=None):
    """Three seeds per variant, 32 windows each scattering by 0.05 nats differently per variant; the
    character frequencies' loss on the same windows at `unigram`, scattering with the text."""
    loss = {"LayerNorm": ln, "no mean subtraction": ln + mean_change, "no division": ln + div_change}
    out = []
    for s in range(3):
        for n, v in loss.items():
            r = {"variant": n, "seed": s, "tokens_per_s": 0.0, "params": 1, "d_ff": 1, "kv_bytes_per_token": 1,
                 "start_loss": start, "val_loss": v + 0.001 * s,
                 "unigram_losses": [unigram + 0.05 * math.sin(w) for w in range(32)],
                 "window_losses": [v + 0.001 * s + 0.05 * math.sin(w * (1 + len(n)) + s) for w in range(32)]}
            if n == "LayerNorm" and s == stuck:  # this seed never gets past the character frequencies
                r["window_losses"] = list(r["unigram_losses"])
                r["val_loss"] = unigram
            if n in diverged:
                r = {k: val for k, val in r.items() if k != "window_losses"} | {"val_loss": math.inf}
            out.append(r)
    return out


def test_division_stabilizes_reproduces_when_only_the_division_matters():
    assert x.judge(_runs(), 60).verdict == REPRODUCED
    c = x.judge(_runs(diverged=("no division",)), 60)
    assert c.verdict == REPRODUCED and c.measured[1] == "diverged"


def test_division_stabilizes_fails_when_the_mean_matters():
    _broken(x.judge(_runs(mean_change=0.3), 60))


def test_division_stabilizes_fails_when_the_division_does_not_matter():
    _broken(x.judge(_runs(div_change=0.0), 60))


def test_division_stabilizes_needs_layernorm_to_train():
    # LayerNorm at the character frequencies' loss (below its loss at initialisation, yet untrained):
    # nothing a norm keeps stable, whatever the parts do
    assert x.judge(_runs(ln=3.3), 60).verdict == NOT_MEASURABLE
    assert x.judge(_runs(ln=3.3, div_change=-0.5), 60).verdict == NOT_MEASURABLE
    assert x.judge(_runs(diverged=("LayerNorm",)), 60).verdict == NOT_MEASURABLE
    assert x.judge(_runs(stuck=2), 60).verdict == NOT_MEASURABLE  # LayerNorm trains in two seeds of three


def test_unigram_losses_are_the_character_frequencies_loss():
    train = torch.tensor([0, 0, 0, 1])  # add-one over a vocabulary of 3: p = 4/7, 2/7, 1/7
    windows = torch.tensor([[0, 0, 1], [2, 2, 2]])
    got = x.unigram_losses(train, windows, 3)
    assert torch.allclose(got, torch.tensor([-(math.log(4 / 7) + math.log(2 / 7)) / 2, -math.log(1 / 7)],
                                            dtype=torch.float64))

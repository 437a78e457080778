"""The speed bands (lab/timed.py): the module's band widened by the 95% interval of the median ratio,
the per-round spread only a gate. Synthetic per-round times make each verdict deterministic; the
A/A test times the same code on both sides and must never read differs."""

import math

import pytest
import torch

from llamablock.lab import exp_norm, timed
from llamablock.lab.details_text import render
from llamablock.lab.record import DIFFERS, NOT_MEASURABLE, REPRODUCED, Claim


def _samples(median: float, scatter: float, n: int) -> dict[str, list[float]]:
    """n rounds whose per-round ratio num / den is median x (1 + scatter x a deterministic wobble)."""
    wobble = [math.sin(2.399 * i) for i in range(n)]  # spread evenly over [-1, 1], median near 0
    return {"num": [median * (1 + scatter * w) for w in wobble], "den": [1.0] * n}


def _judge(median, scatter, n, low=0.85, high=0.90):
    return timed.judge_ratio(Claim("x", "15.3", "", "0.85-0.90"), timed.ratio(_samples(median, scatter, n), "num", "den"),
                             low, high)


def test_band_is_widened_by_the_interval_of_the_median_not_by_the_spread():
    # median 0.80, per-round spread near 0.056: the old band (0.85 - spread) held it; the median's
    # interval over 40 rounds is far narrower, and lies outside 0.85-0.90
    r = timed.ratio(_samples(0.80, 0.10, 40), "num", "den")
    assert 0.85 - r["spread"] <= r["median"]  # what the spread-widened band would have called reproduced
    assert r["interval"][1] < 0.85
    assert _judge(0.80, 0.10, 40).verdict == DIFFERS
    assert _judge(0.87, 0.10, 40).verdict == REPRODUCED


def test_interval_narrows_with_rounds_and_the_spread_does_not():
    few, many = (timed.ratio(_samples(0.87, 0.10, n), "num", "den") for n in (10, 160))
    width = [r["interval"][1] - r["interval"][0] for r in (few, many)]
    assert width[1] < width[0] / 2
    assert many["spread"] == pytest.approx(few["spread"], rel=0.3)
    assert timed.ratio(_samples(0.87, 0.10, 40), "num", "den")["interval"] == \
        timed.ratio(_samples(0.87, 0.10, 40), "num", "den")["interval"]  # seeded


def test_null_and_scattered_ratios_are_not_measurable():
    assert _judge(1.0, 0.10, 40).verdict == NOT_MEASURABLE  # no effect
    assert _judge(0.95, 0.30, 40).verdict == NOT_MEASURABLE  # spread larger than the effect
    # five rounds, two of them near 1: the spread is below the effect, but the median's interval holds 1
    few = {"num": [0.84, 0.85, 0.86, 1.01, 1.02], "den": [1.0] * 5}
    r = timed.ratio(few, "num", "den")
    assert r["spread"] < 1 - r["median"] and r["interval"][1] > 1
    assert timed.verdict(r, 0.85, 0.90) == NOT_MEASURABLE


def _fused_from(medians: dict[int, float], monkeypatch):
    def fake_width(d, quick):
        r = timed.ratio(_samples(medians[d], 0.05, 40), "num", "den")
        return {"vs three-pass": r, "vs one-pass": r}

    monkeypatch.setattr(exp_norm, "_time_width", fake_width)
    monkeypatch.setattr(exp_norm, "FUSED_WIDTHS", tuple(medians))
    return exp_norm.claim_speed_fused(False)


def test_speed_fused_fails_when_one_width_saves_another_share(monkeypatch):
    assert _fused_from({1024: 0.87, 4096: 0.88, 8192: 0.86}, monkeypatch).verdict == REPRODUCED
    c = _fused_from({1024: 0.87, 4096: 0.70, 8192: 0.86}, monkeypatch)
    assert c.verdict == DIFFERS and "width 4096" in render(c.details)


def test_speed_fused_a_a_null_is_not_measurable(monkeypatch):
    """Both sides the same code (RMSNorm timed against itself, eager, 80 rounds at two widths): a
    null effect must read not measurable. Identical code at two call sites can still time apart at
    these small widths on a shared machine, with an interval clear of 1, so one null reading in three
    runs passes: a gate that let nulls through would read differs in all three."""
    monkeypatch.setattr(exp_norm, "FUSED_ROUNDS", {True: 15, False: 80})
    monkeypatch.setattr(exp_norm, "_compile", lambda fn: fn)
    monkeypatch.setattr(exp_norm, "FUSED_WIDTHS", (256, 512))
    monkeypatch.setattr(exp_norm, "_three_pass_layer_norm", exp_norm._rms_norm)
    seen = []
    for attempt in range(3):
        torch.manual_seed(attempt)
        c = exp_norm.claim_speed_fused(False)
        seen.append(c.details)
        if c.verdict == NOT_MEASURABLE:
            break
    assert c.verdict == NOT_MEASURABLE, seen


def test_rounds_put_each_callable_in_every_position():
    seen = []
    fns = {n: (lambda n=n: seen.append(n)) for n in "abc"}
    timed.rounds(fns, repeats=6, warmup=0)
    orders = [tuple(seen[i:i + 3]) for i in range(0, 18, 3)]
    assert {o.index(n) for o in orders for n in "abc"} == {0, 1, 2}
    assert all(sorted(o.index(n) for o in orders) == [0, 0, 1, 1, 2, 2] for n in "abc")

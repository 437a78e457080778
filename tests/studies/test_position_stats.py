"""Bins, ranges and intervals of `rope eval` (studies/position_stats.py), against closed forms
and a direct computation."""

import math
from statistics import NormalDist

import pytest
import torch

from llamablock.studies.position_stats import (
    interval,
    ranges,
    summarize,
    t_quantile_975,
)


def test_t_quantile_matches_closed_forms():
    assert t_quantile_975(1) == pytest.approx(math.tan(math.pi * 0.475), abs=1e-6)  # Cauchy
    p = 0.95  # df 2: t = (2F - 1) sqrt(2 / (1 - (2F - 1)^2)), F = 0.975
    assert t_quantile_975(2) == pytest.approx(p * math.sqrt(2 / (1 - p * p)), abs=1e-6)
    assert t_quantile_975(2000) == pytest.approx(NormalDist().inv_cdf(0.975), abs=2e-3)  # tends to the normal


def test_interval_and_summary_by_hand():
    mean, low, high = interval([1.0, 2.0, 3.0])  # sd 1, t(0.975, 2) / sqrt(3)
    half = t_quantile_975(2) / math.sqrt(3)
    assert (mean, low, high) == pytest.approx((2.0, 2.0 - half, 2.0 + half))
    assert interval([5.0]) == (5.0, None, None)
    assert ranges(47, 16) == {"inside_L": (0, 16), "L_to_2L": (16, 32), "beyond_2L": (32, 47)}
    assert ranges(20, 16) == {"inside_L": (0, 16), "L_to_2L": (16, 20)}
    ref = [torch.arange(10.0), torch.arange(10.0) + 1]
    m = [torch.full((10,), 3.0), torch.full((10,), 5.0)]
    out = summarize({"reference": ref, "x": m}, trained=4, bin_size=4)
    assert [(b["start"], b["end"]) for b in out["x"]["bins"]] == [(0, 4), (4, 8), (8, 10)]
    # reference bin 1: documents' means 5.5 and 6.5; x: 3 and 5; differences -2.5 and -1.5
    assert out["reference"]["bins"][1]["nll"] == pytest.approx(6.0)
    assert out["x"]["bins"][1]["delta"] == pytest.approx(-2.0)
    assert out["x"]["perplexity"]["beyond_2L"] == pytest.approx(math.exp(4.0))
    assert out["reference"]["perplexity"]["inside_L"] == pytest.approx(math.exp((1.5 + 2.5) / 2))
    assert out["x"]["delta"]["L_to_2L"]["mean"] == pytest.approx(4.0 - 6.0)

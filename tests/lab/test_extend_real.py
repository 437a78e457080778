"""Section 15.2 on the real checkpoint (lab.exp_extend_real), judged on synthetic per-token losses:
each check reproduces where the effect is put in, reads differs where it is taken out, and the
quick run records every claim as not run (full lab only), with its tolerance. The real passes run only in the full lab."""

import math

import torch

from llamablock.lab import exp_extend_real as x
from llamablock.lab.record import DIFFERS, NOT_MEASURABLE, NOT_RUN, REPRODUCED

L, N = 64, 128
RUN = {"model": "tiny.gguf", "L": L, "tokens": N, "stride": L // 4, "documents": ["a"]}


def _losses(past=1.0, blur=(0.2, 0.02, 0.01), dynamic_inside=0.0, yarn_factor=-0.05, fixed=0.9):
    """Per-token losses (N - 1,) for one document: a jittered base (so intervals have width) that
    the reference follows everywhere; unscaled rises by `past` after L; each extension costs `blur`
    (linear, ntk, yarn) inside L and removes the share `fixed` of the rise past L; YaRN's factor moves
    its loss past L by `yarn_factor`; dynamic adds `dynamic_inside` inside L."""
    pos = torch.arange(N - 1)
    base = 3.0 + 0.01 * torch.sin(pos.double() * 1.7)
    after = (pos >= L).double()

    def with_(inside=0.0, rise=past * (1 - fixed), noise=0.0):
        return (base + inside * (1 - after) + rise * after + noise * torch.cos(pos.double() * 0.9)).float()

    return {"reference": [with_(rise=0.0)], "none": [with_(rise=past)],
            "linear": [with_(blur[0], noise=0.002)], "ntk": [with_(blur[1], noise=0.002)],
            "yarn": [with_(blur[2], rise=past * (1 - fixed) + yarn_factor, noise=0.002)],
            "yarn-no-factor": [with_(blur[2], noise=0.001)],
            "dynamic": [with_(dynamic_inside)], "llama3": [with_(0.01, noise=0.003)]}


def _judged(monkeypatch, **effects):
    monkeypatch.setattr(x, "BIN", 16)  # bins of 16 positions: four inside L, four past it
    return {c.id: c for c in x.judge(_losses(**effects), RUN)}


def test_every_claim_reproduces_where_the_effect_is_there(monkeypatch):
    got = _judged(monkeypatch)
    assert sorted(got) == sorted(x.CLAIMS)
    for c in got.values():
        assert c.verdict == REPRODUCED, (c.id, c.details)
    assert got["15.2.real-training-free"].measured == 0.95  # YaRN, its factor included: 1 - (0.1 - 0.05) / 1.0
    assert got["15.2.real-past-context"].measured == round(1.0, 4)


def test_past_context_fails_when_nothing_rises(monkeypatch):
    got = _judged(monkeypatch, past=0.0)
    assert got["15.2.real-past-context"].verdict == DIFFERS
    assert got["15.2.real-training-free"].verdict == NOT_MEASURABLE  # nothing to recover


def test_interpolation_blur_fails_when_linear_costs_no_more(monkeypatch):
    assert _judged(monkeypatch, blur=(0.01, 0.02, 0.01))["15.2.real-interpolation-blur"].verdict == DIFFERS
    assert _judged(monkeypatch, blur=(0.0, 0.0, 0.0))["15.2.real-interpolation-blur"].verdict == DIFFERS


def test_dynamic_inside_fails_when_dynamic_changes_the_model_inside_L(monkeypatch):
    """transformers' one-pass forward gives every token the factor of the whole length."""
    c = _judged(monkeypatch, dynamic_inside=1e-3)["15.2.real-dynamic-inside"]
    assert c.verdict == DIFFERS and math.isclose(c.measured, 1e-3, rel_tol=1e-3)


def test_yarn_factor_fails_when_it_does_not_lower_the_loss_past_L(monkeypatch):
    assert _judged(monkeypatch, yarn_factor=0.05)["15.2.real-yarn-factor"].verdict == DIFFERS
    assert _judged(monkeypatch, yarn_factor=0.0)["15.2.real-yarn-factor"].verdict == DIFFERS


def test_training_free_fails_when_no_extension_moves_toward_the_reference(monkeypatch):
    assert _judged(monkeypatch, fixed=0.0, yarn_factor=0.0)["15.2.real-training-free"].verdict == DIFFERS
    partial = _judged(monkeypatch, fixed=0.3)["15.2.real-training-free"]
    assert partial.verdict == NOT_MEASURABLE and "not measured" in partial.details


def test_the_intervals_are_over_bins(monkeypatch):
    """paired() is a t interval over the bins' mean differences: two bins of 16 with means 1 and 3."""
    monkeypatch.setattr(x, "BIN", 16)
    a = {"a": [torch.tensor([1.0] * 16 + [3.0] * 16)], "b": [torch.zeros(32)]}
    mean, low, high = x.paired(a, "a", "b", 0, 32)
    half = 12.706205 * math.sqrt(2) / math.sqrt(2)  # t(0.975, 1) x sd / sqrt(2), sd = sqrt(2)
    assert mean == 2.0 and math.isclose(high - mean, half, rel_tol=1e-5) and math.isclose(mean - low, half, rel_tol=1e-5)


def test_quick_records_every_claim_as_not_run_with_its_tolerance():
    got = x.run(quick=True, out=None)
    assert [c.id for c in got] == list(x.CLAIMS)
    assert all(c.verdict == NOT_RUN and "full `llamablock lab`" in c.details for c in got)
    assert all(c.tolerance == x.TOLERANCES[c.id] for c in got)

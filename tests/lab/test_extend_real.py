"""Section 15.2 on the real checkpoint (lab.exp_extend_real), judged on synthetic per-token losses:
each check reproduces where the effect is put in, reads differs where it is taken out, and the
quick run records every claim as not run (full lab only), with its tolerance. The real passes run only in the full lab."""

import math

import torch

from llamablock.lab import exp_extend_real as x
from llamablock.lab.details_text import render
from llamablock.lab.record import DEFINITION, DIFFERS, NOT_MEASURABLE, NOT_RUN, REPRODUCED

L, N = 64, 128
RUN = {"model": "tiny.gguf", "L": L, "tokens": N, "stride": L // 4, "documents": ["a", "b", "c"]}


def _losses(past=1.0, blur=(0.2, 0.02, 0.01), dynamic_inside=0.0, yarn_factor=-0.05, fixed=0.9, docs=3):
    """Per-token losses (N - 1,) for `docs` documents: a jittered base per document that the reference
    follows everywhere; unscaled rises by `past` after L; each extension costs `blur` (linear, ntk, yarn)
    inside L and removes the share `fixed` of the rise past L; YaRN's factor moves its loss past L by
    `yarn_factor`; dynamic adds `dynamic_inside` inside L. Document k's effects are scaled by 0.9, 1.0,
    1.1 (mean 1), so intervals over documents have width."""
    pos = torch.arange(N - 1)
    after = (pos >= L).double()

    def doc(k):
        base, scale = 3.0 + 0.2 * k + 0.01 * torch.sin(pos.double() * 1.7 + k), 0.9 + 0.1 * k

        def with_(inside=0.0, rise=past * (1 - fixed), noise=0.0):
            return (base + scale * (inside * (1 - after) + rise * after)
                    + noise * torch.cos(pos.double() * 0.9 + k)).float()

        return {"reference": with_(rise=0.0), "none": with_(rise=past),
                "linear": with_(blur[0], noise=0.002), "ntk": with_(blur[1], noise=0.002),
                "yarn": with_(blur[2], rise=past * (1 - fixed) + yarn_factor, noise=0.002),
                "yarn-no-factor": with_(blur[2], noise=0.001),
                "dynamic": with_(dynamic_inside), "llama3": with_(0.01, noise=0.003)}

    per = [doc(k) for k in range(docs)]
    return {m: [d[m] for d in per] for m in per[0]}


def _judged(monkeypatch, **effects):
    return {c.id: c for c in x.judge(_losses(**effects), RUN)}


def test_every_claim_reproduces_where_the_effect_is_there(monkeypatch):
    got = _judged(monkeypatch)
    assert sorted(got) == sorted(x.CLAIMS)
    for c in got.values():
        assert c.verdict == (DEFINITION if c.id == "15.2.real-dynamic-inside" else REPRODUCED), (c.id, c.details)
    assert got["15.2.real-training-free"].measured == 0.95  # YaRN, its factor included: 1 - (0.1 - 0.05) / 1.0
    assert got["15.2.real-past-context"].measured == round(1.0, 4)


def test_past_context_fails_when_nothing_rises(monkeypatch):
    got = _judged(monkeypatch, past=0.0)
    assert got["15.2.real-past-context"].verdict == DIFFERS
    assert got["15.2.real-training-free"].verdict == NOT_MEASURABLE  # nothing to recover


def test_interpolation_blur_fails_when_linear_costs_no_more(monkeypatch):
    assert _judged(monkeypatch, blur=(0.01, 0.02, 0.01))["15.2.real-interpolation-blur"].verdict == DIFFERS
    assert _judged(monkeypatch, blur=(0.0, 0.0, 0.0))["15.2.real-interpolation-blur"].verdict == DIFFERS


def test_dynamic_inside_is_a_definition_that_shows_its_gap(monkeypatch):
    """Holds by the dynamic type's definition (the factor is 1 up to L), so it is shown, not judged;
    the measured gap still reports a dynamic model that changes inside L."""
    c = _judged(monkeypatch, dynamic_inside=1e-3)["15.2.real-dynamic-inside"]
    assert c.verdict == DEFINITION and math.isclose(c.measured, 1e-3 * 1.1, rel_tol=1e-3)


def test_yarn_factor_fails_when_it_does_not_lower_the_loss_past_L(monkeypatch):
    assert _judged(monkeypatch, yarn_factor=0.05)["15.2.real-yarn-factor"].verdict == DIFFERS
    assert _judged(monkeypatch, yarn_factor=0.0)["15.2.real-yarn-factor"].verdict == DIFFERS


def test_training_free_fails_when_the_named_extension_removes_none_of_the_rise(monkeypatch):
    # YaRN a little worse than unscaled past L in every document: none of the rise removed, settled
    assert _judged(monkeypatch, fixed=0.0, yarn_factor=0.02)["15.2.real-training-free"].verdict == DIFFERS
    partial = _judged(monkeypatch, fixed=0.3)["15.2.real-training-free"]
    assert partial.verdict == NOT_MEASURABLE and "not measured" in render(partial.details)


def test_the_intervals_are_over_documents():
    """paired() is a t interval over the documents' mean differences: three documents with means 1, 2, 3."""
    a = {"none": [torch.full((32,), v) for v in (1.0, 2.0, 3.0)], "b": [torch.zeros(32)] * 3}
    mean, low, high = x.paired(a, "none", "b", 0, 32)
    half = 4.302653 * 1.0 / math.sqrt(3)  # t(0.975, 2) x sd / sqrt(3), sd = 1
    assert mean == 2.0 and math.isclose(high - mean, half, rel_tol=1e-5) and math.isclose(mean - low, half, rel_tol=1e-5)


def test_one_document_judges_nothing():
    got = x.judge(_losses(docs=1), {**RUN, "documents": ["a"]})
    assert {c.verdict for c in got if c.id != "15.2.real-dynamic-inside"} == {NOT_MEASURABLE}


def test_training_free_judges_the_method_named_in_advance(monkeypatch):
    """llama3 recovering everything does not rescue a YaRN that removes nothing: no best-of-several."""
    losses = _losses(fixed=0.0, yarn_factor=0.02)
    losses["llama3"] = [r.clone() for r in losses["reference"]]
    c = {c.id: c for c in x.judge(losses, RUN)}["15.2.real-training-free"]
    assert c.verdict == DIFFERS and "yarn (judged)" in [r["method"] for r in c.table]


def test_quick_records_every_claim_as_not_run_with_its_tolerance():
    got = x.run(quick=True, out=None)
    assert [c.id for c in got] == list(x.CLAIMS)
    assert all(c.verdict == NOT_RUN and "full `llamablock lab`" in render(c.details) for c in got)
    assert all(c.tolerance == x.TOLERANCES[c.id] for c in got)

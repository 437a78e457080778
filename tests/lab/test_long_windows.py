"""15.2's trained claims judged window by window (the study's `window_curves`, lab/long_windows.py):
the rise past L is paired within each window with a margin over windows, interpolation's
fine-tuning is judged inside L against a control that may gain too, YaRN's recovery against the
control in the same windows, ALiBi's rise against half of RoPE's window by window, and the
precondition (the model uses position) on windows too. A per-position scatter that averages out
over each band is the break case for a margin over positions: window by window it is no noise."""

from test_lab import _broken, _long_result

from llamablock.lab import exp_long
from llamablock.lab.record import NOT_MEASURABLE, REPRODUCED
from llamablock.studies import long_context


def _claims(monkeypatch, res) -> dict:
    monkeypatch.setattr(long_context, "run_long_context", lambda **k: res)
    return {c.id: c for c in exp_long.long_context_claims(True, None)}


def _edit(res, name, lo, hi, change):
    """Every window of curve `name` (all its lengths) changed at positions [lo, hi) by change(i) added; the
    mean curves follow."""
    for n, per in res["window_curves"][name].items():
        for w in per:
            for i in range(lo, min(hi, len(w))):
                w[i] += change(i)
        res["curves"][name][n] = [sum(w[i] for w in per) / len(per) for i in range(len(per[0]))]


def _shift(res, name, lo, hi, by):
    _edit(res, name, lo, hi, lambda i: by)


def _scatter(res, name, size):
    """+size, -size at alternate positions, the same in every window: it averages to 0 over every band."""
    _edit(res, name, 0, 10**6, lambda i: size * (-1) ** i)


def test_interpolation_finetune_fails_when_the_control_gains_as_much_inside_l(monkeypatch):
    res = _long_result(0.05, 0.3, 0.1)  # fine-tuning removes 0.3 of linear's blur inside L
    assert _claims(monkeypatch, res)["15.2.interpolation-finetune"].verdict == REPRODUCED
    _shift(res, "rope none + fine-tune", 0, 16, -0.3)  # the control gains as much inside L
    _broken(_claims(monkeypatch, res)["15.2.interpolation-finetune"])


def test_interpolation_finetune_is_not_judged_where_the_control_learns_unseen_angles(monkeypatch):
    # the control gains 0.4 past L (angles it had never seen) and nothing inside L; linear gains 0.1
    # inside L: judged past L this read differs; inside L, where the blur is, it reproduces
    res = _long_result(0.05, 0.1, 0.1)
    _shift(res, "rope none + fine-tune", 16, 64, -0.4)
    assert _claims(monkeypatch, res)["15.2.interpolation-finetune"].verdict == REPRODUCED


def test_unscaled_rise_fails_without_a_rise_in_the_same_windows(monkeypatch):
    res = _long_result(0.05, 0.3, 0.1, rope_rise=0.03)
    _scatter(res, "rope none", 0.2)  # a per-position scatter much larger than the rise
    c = _claims(monkeypatch, res)["15.2.unscaled-rise"]
    assert c.verdict == REPRODUCED and "windows" in c.tolerance, c.details
    _shift(res, "rope none", 64, 128, -0.03)  # the far band back to the level inside L
    _broken(_claims(monkeypatch, res)["15.2.unscaled-rise"])


def test_extensions_recover_fails_when_the_control_gains_as_much(monkeypatch):
    res = _long_result(0.05, 0.45, 0.1)
    _scatter(res, "rope yarn + fine-tune", 2.0)  # over positions this scatter would hide YaRN's lead
    assert _claims(monkeypatch, res)["15.2.extensions-recover"].verdict == REPRODUCED
    _shift(res, "rope none + fine-tune", 32, 64, -0.35)  # the control, fine-tuned unscaled, ends level with YaRN
    _broken(_claims(monkeypatch, res)["15.2.extensions-recover"])


def test_extensions_recover_fails_when_less_than_half_is_removed(monkeypatch):
    _broken(_claims(monkeypatch, _long_result(0.05, 0.2, 0.1))["15.2.extensions-recover"])


def test_long_context_fails_when_alibi_rises_as_much_in_the_same_windows(monkeypatch):
    res = _long_result(0.05, 0.45, 0.1)
    _scatter(res, "alibi", 1.0)
    assert _claims(monkeypatch, res)["15.2.long-context"].verdict == REPRODUCED
    _shift(res, "alibi", 16, 128, 0.35)  # ALiBi's rise now that of unscaled RoPE
    _broken(_claims(monkeypatch, res)["15.2.long-context"])
    res = _long_result(0.2, 0.45, 0.1)  # exactly half of RoPE's rise: not settled either way
    assert _claims(monkeypatch, res)["15.2.long-context"].verdict == NOT_MEASURABLE


def test_uses_position_is_judged_over_windows(monkeypatch):
    # rescaling moves the far loss by 0.1 in every window, under a per-position scatter of 1: a margin
    # over positions called that noise and left every claim unmeasured; over windows it is clear
    res = _long_result(0.05, 0.45, 0.1)
    for n in ("rope ntk", "rope dynamic", "rope yarn", "rope linear"):
        _scatter(res, n, 1.0)
    assert all(c.verdict == REPRODUCED for c in _claims(monkeypatch, res).values())
    res = _long_result(0.05, 0.45, 0.0)  # rescaling moves nothing: the model ignores position
    assert all(c.verdict == NOT_MEASURABLE for c in _claims(monkeypatch, res).values())

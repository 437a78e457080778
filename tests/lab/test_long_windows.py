"""15.2's trained claims judged window by window (lab/long_windows.py): the per-window curves average
to the study's own, the rise past L is paired within each window with a margin over windows, and
interpolation's fine-tuning is judged inside L against a control that may gain too."""


import torch
from test_lab import _broken, _long_result

from llamablock.lab import exp_long, long_windows
from llamablock.lab.record import REPRODUCED
from llamablock.studies import long_context


def _claims(monkeypatch, res) -> dict:
    monkeypatch.setattr(exp_long, "run_with_windows", lambda **k: res)
    return {c.id: c for c in exp_long.long_context_claims(True, None)}


def _shift(res, name, lo, hi, by):
    """Every window of curve `name` (all its lengths) moved by `by` at positions [lo, hi); the mean curves follow."""
    for n, per in res["window_curves"][name].items():
        for w in per:
            for i in range(lo, min(hi, len(w))):
                w[i] += by
        res["curves"][name][n] = [sum(w[i] for w in per) / len(per) for i in range(len(per[0]))]


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
    # a small rise, the same in every window, above a per-position scatter much larger than it
    for n, per in res["window_curves"]["rope none"].items():
        for w in per:
            for i in range(len(w)):
                w[i] += 0.2 * (-1) ** i  # averages to 0 over each band
        res["curves"]["rope none"][n] = [sum(w[i] for w in per) / len(per) for i in range(len(per[0]))]
    c = _claims(monkeypatch, res)["15.2.unscaled-rise"]
    assert c.verdict == REPRODUCED and "windows" in c.tolerance, c.details
    _shift(res, "rope none", 64, 128, -0.03)  # the far band back to the level inside L
    _broken(_claims(monkeypatch, res)["15.2.unscaled-rise"])


def test_run_with_windows_keeps_the_windows_the_study_averaged(monkeypatch):
    from llamablock.model import Decoder
    from llamablock.presets import preset

    torch.manual_seed(0)
    model = Decoder(preset("llama-2024-small", d_model=32, n_heads=2, n_kv_heads=1, n_layers=1, max_seq_len=64,
                           vocab_size=50))
    ids = torch.randint(0, 50, (400,))

    def study(**k):  # the study's shape: curves from long_context.loss_by_position, looked up at call time
        return {"curves": {"rope none": {str(n): long_context.loss_by_position(model, ids, n, 6) for n in (16, 32)}}}

    monkeypatch.setattr(long_context, "run_long_context", study)
    res = long_windows.run_with_windows()
    assert long_context.loss_by_position is not None and long_context.loss_by_position.__name__ == "loss_by_position"
    for n in ("16", "32"):
        per = res["window_curves"]["rope none"][n]
        assert len(per) == 6 and len(per[0]) == int(n)
        assert res["curves"]["rope none"][n] == long_context.loss_by_position(model, ids, int(n), 6)
        assert max(abs(sum(w[i] for w in per) / 6 - c) for i, c in enumerate(res["curves"]["rope none"][n])) < 1e-12

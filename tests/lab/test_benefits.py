"""15.6.ablation judged per change on the benefit the module names for it (lab/benefits.py): a run
where each change shows its benefit reproduces; taking any one benefit away reads differs."""

from test_lab import _broken, _records

from llamablock.lab import exp_training, shared
from llamablock.lab.details_text import render
from llamablock.lab.record import REPRODUCED

CALM = {n: 2.5 for n in shared.NAMES} | {"2017 + SwiGLU": 2.4}
HOT = {n: 2.9 for n in shared.NAMES} | {"2017 + RMSNorm pre-LN": 2.6, "2024": 2.6}  # pre-LN rises 0.1, 2017 0.4


def _ablation(monkeypatch, calm=CALM, hot=HOT, gqa_bytes=0.5):
    def runs(*a, lr=1e-3, **k):
        records = _records(hot if lr > 1e-3 else calm)
        for r in records:
            r["kv_bytes_per_token"] = 1000 * (gqa_bytes if r["variant"] == "2017 + GQA" else 1)
        return records

    monkeypatch.setattr(exp_training, "run_variants", runs)
    return {c.id: c for c in exp_training.ablation_claims(True, None)}["15.6.ablation"]


def test_ablation_reproduces_when_each_change_shows_its_benefit(monkeypatch):
    c = _ablation(monkeypatch)
    assert c.verdict == REPRODUCED, c.details
    judged = {r["variant"]: r["verdict"] for r in c.table if r["verdict"]}
    assert judged == {"2017 + RMSNorm pre-LN": "reproduced", "2017 + GQA": "reproduced",
                      "2017 + SwiGLU": "reproduced", "2017 + RoPE": "definition"}


def test_ablation_fails_when_pre_ln_is_no_more_stable(monkeypatch):
    _broken(_ablation(monkeypatch, hot=HOT | {"2017 + RMSNorm pre-LN": 3.0}))


def test_ablation_fails_when_gqa_saves_no_cache(monkeypatch):
    _broken(_ablation(monkeypatch, gqa_bytes=1))


def test_ablation_fails_when_gqa_trains_worse(monkeypatch):
    _broken(_ablation(monkeypatch, calm=CALM | {"2017 + GQA": 2.8}))


def test_ablation_fails_when_swiglu_does_not_lower_the_loss(monkeypatch):
    c = _ablation(monkeypatch, calm=CALM | {"2017 + SwiGLU": 2.7})
    _broken(c)
    assert "SwiGLU" in render(c.details).split("Not every judged change shows its benefit:")[1]

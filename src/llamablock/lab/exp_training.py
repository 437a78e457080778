"""Claims that need training (sections 15.3, 15.4, 15.5, 15.6): single-change ablations at equal
parameters, and MHA -> GQA conversion by averaging key and value heads, against a control.

Small models on character-level Shakespeare. Every difference is judged against a noise threshold
derived from the run (`shared.noise`): twice the standard error of the per-window loss difference
over the evaluation windows, paired by window and seed, and with three seeds (the full run) at
least twice the larger standard deviation between seeds; one seed (--quick) is said in the record. The variants are `llamablock.studies.ablation`'s, plus one the module's
RMSNorm claim needs: 2017 + RMSNorm with the norm kept after the add (post-LN), so that the
dropped mean is measured with the placement held fixed. Quick runs train a 2-layer width-64
model for 60 steps: their verdicts are marked indicative. These are findings at this size and
budget, not at LLaMA's.
"""

from __future__ import annotations

import dataclasses

import torch

from llamablock.lab.benefits import STABLE, claim_ablation
from llamablock.lab.details_text import said
from llamablock.lab.record import Claim
from llamablock.lab.shared import (
    FULL,
    INDICATIVE,
    QUICK,
    _loss,
    _row,
    run_variants,
    window_losses,
)
from llamablock.lab.shared import noise as shared_noise
from llamablock.model import Decoder
from llamablock.presets import preset
from llamablock.runtime.evaluate import evaluate
from llamablock.studies import ablation
from llamablock.training import data as D
from llamablock.training.train import TrainConfig, get_data, init_weights, train

# The ids of the claims this experiment records (for `llamablock lab --only`).
CLAIMS = (
    "15.3.training-quality",
    "15.4.training-quality",
    "15.5.training-quality",
    "15.6.ablation",
    "15.6.training-stability",
    "15.5.mha-to-gqa",
)


def _compare(records, summary, name: str, base_name: str = "2017") -> tuple[float, float, list[dict]]:
    """(loss of `name` minus `base_name`'s, its noise threshold, the details' sentences saying both)."""
    base, var = _row(summary, base_name), _row(summary, name)
    noise, how = shared_noise([(records, summary, name, 1), (records, summary, base_name, -1)])
    delta = var["val_loss"] - base["val_loss"]
    text = [said("compare", name=name, loss=_loss(var), base=base_name, base_loss=_loss(base), params=var["params"],
                 base_params=base["params"], noise=noise), how]
    return delta, noise, text


def ablation_claims(quick: bool, out) -> list[Claim]:
    p = QUICK if quick else FULL
    records = run_variants(p["steps"], p["seeds"], p["size"], p["context"])
    summary = ablation.summarize(records)
    plots = []
    if out is not None:
        from llamablock.lab.plots import plot_ablation

        plots = plot_ablation(records, summary, out)
    claims = []

    delta, noise, text = _compare(records, summary, "2017 + RMSNorm")
    pre = _row(summary, "2017 + RMSNorm pre-LN")
    c = Claim("15.3.training-quality", "15.3", "without the mean, models train about as well (Zhang & Sennrich)",
              "about as well", measured=round(delta, 4), unit="val loss, RMSNorm - LayerNorm (both post-LN), nats/char",
              tolerance="not worse by more than the noise")
    ok = delta <= noise
    worse = [said("15.3.training-quality worse", delta=delta, noise=noise, steps=p["steps"])] if not ok else []
    claims.append(c.judge(ok, *text, said("15.3.training-quality", pre=_loss(pre), pre_delta=pre["val_loss"] - _row(
        summary, "2017 + RMSNorm")["val_loss"]), *worse))

    delta, noise, text = _compare(records, summary, "2017 + SwiGLU")
    gelu = _row(summary, "2017 + GELU")
    swiglu = _row(summary, "2017 + SwiGLU")
    to_gelu = swiglu["val_loss"] - gelu["val_loss"]
    c = Claim("15.4.training-quality", "15.4", "at equal size SwiGLU reaches lower loss than ReLU and GELU (Shazeer)",
              "lower", measured=[round(delta, 4), round(to_gelu, 4)],
              unit="val loss, SwiGLU - ReLU (the 2017 model) / SwiGLU - GELU, nats/char",
              tolerance="lower than ReLU and GELU by more than the noise; above either by more than the noise: differs")
    lines = [*text, said("15.4.training-quality", gelu=_loss(gelu), steps=p["steps"])]
    if delta < -noise and to_gelu < -noise:
        claims.append(c.judge(True, *lines))
    elif delta > noise or to_gelu > noise:  # above an ungated layer beyond the noise: against the statement
        claims.append(c.judge(False, *lines, said("15.4.training-quality not lower", relu=delta, gelu=to_gelu,
                                                  noise=noise)))
    else:  # lower than one, within the noise of the other: 'lower than both' is not settled at this size
        claims.append(c.unmeasurable(*lines, said("15.4.training-quality unsettled", relu=delta, gelu=to_gelu,
                                                  noise=noise)))

    delta, noise, text = _compare(records, summary, "2017 + GQA")
    mqa_delta, mqa_noise, _ = _compare(records, summary, "2017 + MQA", "2017 + GQA")  # MQA - GQA, with their own noise
    c = Claim("15.5.training-quality", "15.5", "GQA quality close to MHA and better than MQA (Ainslie et al.)",
              "close; better", measured=[round(delta, 4), round(mqa_delta, 4)],
              unit="val loss, GQA - MHA / MQA - GQA, nats/char",
              tolerance="|GQA - MHA| within the noise, and MQA above GQA by more than the noise")
    close, better, worse = abs(delta) <= noise, mqa_delta > mqa_noise, mqa_delta < -mqa_noise
    lines = [*text, said("15.5.training-quality", mqa=mqa_delta, noise=mqa_noise)]
    if close and better:
        claims.append(c.judge(True, *lines))
    elif not close or worse:
        claims.append(c.judge(False, *lines, *([said("15.5.training-quality not close")] if not close else []),
                              *([said("15.5.training-quality mqa better")] if worse else []),
                              said("15.5.training-quality size", steps=p["steps"],
                                   params=_row(summary, "2017 + GQA")["params"])))
    else:
        claims.append(c.unmeasurable(*lines, said("15.5.training-quality unsettled")))

    hot_records = run_variants(p["steps"], p["seeds"], p["size"], p["context"], names=("2017", STABLE, "2024"),
                               lr=1e-2, warmup=0.1)
    hot = ablation.summarize(hot_records)
    c = claim_ablation(records, summary, hot_records, hot, p["steps"])
    c.plots = plots
    claims.append(c)
    claims.append(claim_stability(records, summary, hot_records, hot))
    if quick:
        for claim in claims:
            claim.indicative = [INDICATIVE]
    return claims


def claim_stability(records: list[dict], summary: list[dict], hot_records: list[dict], hot: list[dict]) -> Claim:
    """'Each detail makes training more stable': both blocks again at ten times the learning rate
    with a short warm-up (a tenth of the steps); the more stable block loses less."""
    rise = {n: _row(hot, n)["val_loss"] - _row(summary, n)["val_loss"] for n in ("2017", "2024")}
    noise, how = shared_noise([(hot_records, hot, "2024", 1), (records, summary, "2024", -1),
                               (hot_records, hot, "2017", -1), (records, summary, "2017", 1)])
    c = Claim("15.6.training-stability", "15.6", "the 2024 block's details make training more stable", "more stable",
              measured=[round(rise["2017"], 4), round(rise["2024"], 4)],
              unit="val loss rise at lr 1e-2 with a short warm-up, 2017 / 2024, nats/char",
              tolerance="the 2024 block's rise smaller than the 2017 block's by more than the noise")
    ok = rise["2024"] < rise["2017"] - noise
    return c.judge(ok, said("15.6.training-stability", old=_loss(_row(hot, "2017")), old_rise=rise["2017"],
                            new=_loss(_row(hot, "2024")), new_rise=rise["2024"], noise=noise), how)


def average_kv_heads(model: Decoder, n_kv: int) -> Decoder:
    """MHA -> GQA as Ainslie et al. convert checkpoints: each new key (value) head is the mean of
    the key (value) heads of the query heads in its group."""
    cfg = model.cfg
    g = cfg.n_kv_heads // n_kv
    new = Decoder(cfg.replace(n_kv_heads=n_kv))
    state = model.state_dict()
    for name, w in list(state.items()):
        if any(name.endswith(f"attn.{m}.{kind}") for m in ("wk", "wv") for kind in ("weight", "bias")):
            heads = w.view(cfg.n_kv_heads, cfg.head_dim, *w.shape[1:])  # (old n_kv, hd, D)
            state[name] = heads.view(n_kv, g, cfg.head_dim, *w.shape[1:]).mean(1).reshape(n_kv * cfg.head_dim, *w.shape[1:])
    new.load_state_dict(state)
    return new.eval()


def reinit_kv_heads(model: Decoder, n_kv: int) -> Decoder:
    """The control: the same model with n_kv key/value heads freshly initialised (train's init)."""
    fresh = Decoder(model.cfg.replace(n_kv_heads=n_kv))
    init_weights(fresh)
    state = model.state_dict()
    for name, w in fresh.state_dict().items():
        if any(name.endswith(f"attn.{m}.{kind}") for m in ("wk", "wv") for kind in ("weight", "bias")):
            state[name] = w
    fresh.load_state_dict(state)
    return fresh.eval()


# quick -> (training steps, uptraining steps, model size) of 15.5.mha-to-gqa
CONVERSION = {True: (80, 16, dict(d_model=64, n_heads=4, n_layers=2)),
              False: (300, 30, dict(d_model=128, n_heads=4, n_layers=4))}


def claim_conversion(quick: bool) -> Claim:
    """MHA (4 KV heads) -> GQA (2) by mean-pooling, then brief uptraining; the control re-initialises
    the key/value heads instead and gets the same steps. Reproduced when uptraining recovers at least
    half of the conversion penalty (the gap to MHA given the same extra steps) and the mean-pooled
    start ends below the control."""
    steps, uptrain, size = CONVERSION[quick]
    t = TrainConfig(steps=steps, batch_size=16, context=64, lr=1e-3, warmup=steps // 5, eval_every=steps,
                    eval_windows=32)
    mha_cfg = preset("llama-2024-small", n_kv_heads=size["n_heads"], max_seq_len=64, **size)
    mha = train(mha_cfg, t, None, progress=False)
    windows = D.eval_windows(get_data(t).val, t.context, t.eval_windows)
    up = dataclasses.replace(t, steps=uptrain, warmup=max(1, uptrain // 5), eval_every=uptrain, lr=3e-4)
    mha_more = train(mha_cfg, up, None, progress=False, init_state=mha["model"].state_dict())["val_loss"]
    res, per_window = {}, {}
    for name, convert in (("mean-pooled", average_kv_heads), ("control", reinit_kv_heads)):
        m = convert(mha["model"], 2)
        after = train(m.cfg, up, None, progress=False, init_state=m.state_dict())
        res[name] = (evaluate(m, windows), after["val_loss"])
        per_window[name] = window_losses(after["model"], windows)
    # paired on the same windows: the control's margin is twice the standard error of the mean
    # per-window difference (a two-sided 95% interval), the noise of this evaluation
    diff = per_window["control"] - per_window["mean-pooled"]
    margin = 2 * float(diff.std()) / len(diff) ** 0.5
    below = float(diff.mean()) > margin
    penalty = res["mean-pooled"][0] - mha_more
    gap = res["mean-pooled"][1] - mha_more
    c = Claim("15.5.mha-to-gqa", "15.5", "an MHA model converts to GQA by averaging KV heads, then brief training",
              "close to MHA after brief training", unit="val loss gap to MHA, nats/char: at conversion / after uptraining",
              measured=[round(penalty, 4), round(gap, 4)],
              tolerance="uptraining recovers at least half the conversion penalty, and ends below the control by more "
                        "than twice the paired standard error over the evaluation windows")
    ok = penalty > 0 and gap <= 0.5 * penalty and below
    why = ([said("15.5.mha-to-gqa nothing to recover")] if penalty <= 0 else []) + (
        [said("15.5.mha-to-gqa half")] if penalty > 0 and gap > 0.5 * penalty else []) + (
        [said("15.5.mha-to-gqa control")] if not below else [])
    c.judge(ok, said("15.5.mha-to-gqa", layers=size["n_layers"], width=size["d_model"], heads=size["n_heads"],
                     steps=steps, mha=mha["val_loss"], mha_more=mha_more, uptrain=uptrain,
                     pooled_start=res["mean-pooled"][0], pooled_end=res["mean-pooled"][1], share=uptrain / steps,
                     control_start=res["control"][0], control_end=res["control"][1], windows=len(diff),
                     above=float(diff.mean()), margin=margin), *why)
    if quick:
        full_steps, _, full = CONVERSION[False]
        c.indicative = [said("15.5.mha-to-gqa quick", steps=steps, layers=size["n_layers"], width=size["d_model"],
                             uptrain=uptrain, full_layers=full["n_layers"], full_width=full["d_model"],
                             full_steps=full_steps)]
    return c


def run(quick: bool, out) -> list[Claim]:
    torch.manual_seed(0)
    return ablation_claims(quick, out) + [claim_conversion(quick)]

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


def _compare(records, summary, name: str, base_name: str = "2017") -> tuple[float, float, str]:
    base, var = _row(summary, base_name), _row(summary, name)
    noise, how = shared_noise([(records, summary, name, 1), (records, summary, base_name, -1)])
    delta = var["val_loss"] - base["val_loss"]
    text = (f"{name}: {_loss(var)} vs {base_name}: {_loss(base)} nats/char ({var['params']:,} vs {base['params']:,} "
            f"parameters); noise threshold {noise:.4f} ({how})")
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
    claims.append(c.judge(ok, text + f". Placement held fixed (both post-LN). Moving RMSNorm before each "
                          f"sub-layer as well (pre-LN): {_loss(pre)}, {pre['val_loss'] - _row(summary, '2017 + RMSNorm')['val_loss']:+.4f} "
                          "against post-LN RMSNorm: that part is the placement's, not the dropped mean's."
                          + ("" if ok else f" RMSNorm worse by {delta:+.4f}, beyond the noise {noise:.4f}, after "
                             f"{p['steps']} steps.")))

    delta, noise, text = _compare(records, summary, "2017 + SwiGLU")
    gelu = _row(summary, "2017 + GELU")
    swiglu = _row(summary, "2017 + SwiGLU")
    c = Claim("15.4.training-quality", "15.4", "at equal size SwiGLU reaches lower loss than ReLU and GELU (Shazeer)",
              "lower", measured=round(delta, 4), unit="val loss change vs the ReLU 2017 model, nats/char",
              tolerance="lower than ReLU and GELU by more than the noise")
    ok = delta < -noise and swiglu["val_loss"] < gelu["val_loss"] - noise
    claims.append(c.judge(ok, text + f". GELU at the same budget: {_loss(gelu)}; {p['steps']} steps."
                          + ("" if ok else f" SwiGLU minus ReLU {delta:+.4f}, minus GELU "
                             f"{swiglu['val_loss'] - gelu['val_loss']:+.4f}: not both below -{noise:.4f}.")))

    delta, noise, text = _compare(records, summary, "2017 + GQA")
    mqa_delta, mqa_noise, _ = _compare(records, summary, "2017 + MQA", "2017 + GQA")  # MQA - GQA, with their own noise
    c = Claim("15.5.training-quality", "15.5", "GQA quality close to MHA and better than MQA (Ainslie et al.)",
              "close; better", measured=[round(delta, 4), round(mqa_delta, 4)],
              unit="val loss, GQA - MHA / MQA - GQA, nats/char",
              tolerance="|GQA - MHA| within the noise, and MQA above GQA by more than the noise")
    close, better, worse = abs(delta) <= noise, mqa_delta > mqa_noise, mqa_delta < -mqa_noise
    said = (text + f"; MQA (one KV head) against GQA: {mqa_delta:+.4f}, noise threshold {mqa_noise:.4f}. Pairs of "
            "query heads share a KV head; the saved parameters go to a wider feed-forward layer (equal budget).")
    if close and better:
        claims.append(c.judge(True, said))
    elif not close or worse:
        claims.append(c.judge(False, said + (" GQA is not within the noise of MHA." if not close else "")
                              + (" MQA trained better than GQA by more than the noise." if worse else "")
                              + f" {p['steps']} steps of {_row(summary, '2017 + GQA')['params']:,}-parameter models."))
    else:
        claims.append(c.unmeasurable(said + " GQA is within the noise of MHA, but MQA and GQA are within the noise "
                                     "of each other, so 'better than MQA' is not settled at this size."))

    hot_records = run_variants(p["steps"], p["seeds"], p["size"], p["context"], names=("2017", STABLE, "2024"),
                               lr=1e-2, warmup=0.1)
    hot = ablation.summarize(hot_records)
    c = claim_ablation(records, summary, hot_records, hot, p["steps"])
    c.plots = plots
    claims.append(c)
    claims.append(claim_stability(records, summary, hot_records, hot))
    if quick:
        for claim in claims:
            claim.indicative = INDICATIVE
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
    return c.judge(ok, f"both blocks at lr 1e-2 (ten times the ablation's) with warm-up over 10% of the steps instead "
                   f"of 40%: 2017 {_loss(_row(hot, '2017'))} ({rise['2017']:+.4f} against lr 1e-3), 2024 "
                   f"{_loss(_row(hot, '2024'))} ({rise['2024']:+.4f}); noise threshold {noise:.4f} ({how}). Post-LN is the "
                   "known fragile part (Xiong et al. 2020): it needs a long warm-up, pre-LN does not.")


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


def claim_conversion(quick: bool) -> Claim:
    """MHA (4 KV heads) -> GQA (2) by mean-pooling, then brief uptraining; the control re-initialises
    the key/value heads instead and gets the same steps. Reproduced when uptraining recovers at least
    half of the conversion penalty (the gap to MHA given the same extra steps) and the mean-pooled
    start ends below the control."""
    steps, uptrain = (80, 16) if quick else (300, 30)
    size = dict(d_model=64, n_heads=4, n_layers=2) if quick else dict(d_model=128, n_heads=4, n_layers=4)
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
    why = "" if ok else (" Not reproduced: " + ("the conversion cost nothing to recover. " if penalty <= 0 else "")
                         + ("uptraining recovered less than half the penalty. " if penalty > 0 and gap > 0.5 * penalty else "")
                         + ("the re-initialised control ended within the noise margin of it (or below it), so the "
                            "averaging did not show to matter at this size. " if not below else "")
                         + f"Uptraining here: {uptrain} steps, {uptrain / steps:.0%} of the original (Ainslie et al.: 5%).")
    c.judge(ok, f"a {size['n_layers']}-layer width-{size['d_model']} model with {size['n_heads']} KV heads trained "
            f"{steps} steps (val {mha['val_loss']:.4f}; {mha_more:.4f} after {uptrain} more steps), its key and value "
            f"heads averaged in pairs into 2 (GQA, Ainslie et al.'s mean-pooling): {res['mean-pooled'][0]:.4f} right "
            f"after conversion, {res['mean-pooled'][1]:.4f} after {uptrain} steps ({uptrain / steps:.0%} of the "
            f"original; Ainslie et al. use 5%). Control, key/value heads re-initialised: {res['control'][0]:.4f}, then "
            f"{res['control'][1]:.4f}. Paired over the {len(diff)} evaluation windows the control ends "
            f"{float(diff.mean()):+.4f} above the mean-pooled model, noise margin {margin:.4f} (2 standard errors). "
            "One seed." + why)
    if quick:
        c.indicative = (f"quick run: one seed, {steps} steps of a 2-layer width-64 model, {uptrain} uptraining steps; "
                    "`llamablock lab` trains 4 layers of width 128 for 300")
    return c


def run(quick: bool, out) -> list[Claim]:
    torch.manual_seed(0)
    return ablation_claims(quick, out) + [claim_conversion(quick)]

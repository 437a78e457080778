"""Claims that need training (sections 15.3, 15.4, 15.5, 15.6): the single-change ablation of
`llamablock compare`, and MHA -> GQA conversion by averaging key and value heads.

Small models on character-level Shakespeare, so a difference is judged against the spread
between seeds: `noise` = max(2 x the larger of the two seed standard deviations, 0.01 nats). With
one seed (--quick) there is no spread; the threshold is then 0.02 nats and the verdict is
marked indicative. These are findings at this size and budget, not at LLaMA's.
"""

from __future__ import annotations

import dataclasses

import torch

from llamablock.lab.record import Claim
from llamablock.model import Decoder
from llamablock.presets import preset
from llamablock.runtime.evaluate import evaluate
from llamablock.studies import ablation
from llamablock.training import data as D
from llamablock.training.train import TrainConfig, get_data, train

QUICK = dict(steps=60, seeds=(0,), size=dict(d_model=64, n_heads=4, n_layers=2), context=64)
FULL = dict(steps=200, seeds=(0, 1, 2), size=None, context=128)


# The ids of the claims this experiment records (for `llamablock lab --only`).
CLAIMS = (
    "15.3.training-quality",
    "15.4.training-quality",
    "15.5.training-quality",
    "15.6.ablation",
    "15.5.mha-to-gqa",
)


def _row(summary: list[dict], name: str) -> dict:
    return next(r for r in summary if r["variant"] == name)


def _noise(a: dict, b: dict) -> tuple[float, str]:
    if a["seeds"] < 2:
        return 0.02, "one seed, indicative only: threshold 0.02 nats"
    return max(2 * max(a["val_std"], b["val_std"]), 0.01), f"{a['seeds']} seeds: threshold 2 sd"


def _compare(summary, name: str) -> tuple[float, float, str, str]:
    base, var = _row(summary, "2017"), _row(summary, name)
    noise, how = _noise(base, var)
    delta = var["val_loss"] - base["val_loss"]
    text = (f"{name}: {var['val_loss']:.4f} ± {var['val_std']:.4f} vs 2017: {base['val_loss']:.4f} ± "
            f"{base['val_std']:.4f} nats/char ({var['params']:,} vs {base['params']:,} parameters); {how} "
            f"= {noise:.3f}")
    return delta, noise, text, how


def ablation_claims(quick: bool, out) -> list[Claim]:
    p = QUICK if quick else FULL
    names = list(ablation.DEFAULT_VARIANTS) + ["2017 + GELU", "2017 + MQA"]
    records = ablation.run_compare(steps=p["steps"], seeds=p["seeds"], size=p["size"], context=p["context"],
                                   names=names, log=None)
    summary = ablation.summarize(records)
    plots = []
    if out is not None:
        ablation.plot_compare(records, summary, out / "ablation.png")
        plots = ["ablation.png"]
    claims = []

    delta, noise, text, _ = _compare(summary, "2017 + RMSNorm pre-LN")
    c = Claim("15.3.training-quality", "15.3", "without the mean, models train about as well (Zhang & Sennrich)",
              "about as well", measured=round(delta, 4), unit="val loss change vs 2017, nats/char",
              tolerance="not worse by more than the noise")
    claims.append(c.judge(delta <= noise, text + ". The variant also moves the norm before each sub-layer "
                          "(pre-LN), so placement and the dropped mean are measured together."))

    delta, noise, text, _ = _compare(summary, "2017 + SwiGLU")
    gelu = _row(summary, "2017 + GELU")
    c = Claim("15.4.training-quality", "15.4", "at equal size SwiGLU reaches lower loss than ReLU and GELU (Shazeer)",
              "lower", measured=round(delta, 4), unit="val loss change vs the ReLU 2017 model, nats/char",
              tolerance="lower than ReLU and GELU by more than the noise")
    claims.append(c.judge(delta < -noise and _row(summary, "2017 + SwiGLU")["val_loss"] < gelu["val_loss"] - noise,
                          text + f". GELU at the same budget: {gelu['val_loss']:.4f} ± {gelu['val_std']:.4f}."))

    delta, noise, text, _ = _compare(summary, "2017 + GQA")
    c = Claim("15.5.training-quality", "15.5", "GQA quality close to MHA (Ainslie et al.)", "close",
              measured=round(delta, 4), unit="val loss change vs MHA, nats/char", tolerance="|change| within the noise")
    mqa = _row(summary, "2017 + MQA")
    claims.append(c.judge(abs(delta) <= noise, text + ". Pairs of query heads share a KV head; the saved "
                          "parameters go to a wider feed-forward layer (equal budget). MQA (one KV head) at the same "
                          f"budget: {mqa['val_loss']:.4f} ± {mqa['val_std']:.4f} ({mqa['delta_vs_2017']:+.4f}); "
                          "Ainslie et al. put GQA between MHA and MQA."))

    delta, noise, text, _ = _compare(summary, "2024")
    c = Claim("15.6.ablation", "15.6", "the 2024 block against the 2017 block at equal parameters and compute",
              "better or equal", measured=round(delta, 4), unit="val loss change vs 2017, nats/char",
              tolerance="not worse by more than the noise")
    table = "; ".join(f"{r['variant']}: {r['val_loss']:.4f} ({r['delta_vs_2017'] or 0:+.4f}, "
                      f"{r['tokens_per_s']:,.0f} tok/s, KV {r['kv_bytes_per_token']} B/token)" for r in summary)
    c.plots = plots
    claims.append(c.judge(delta <= noise, text + f". All variants, {p['steps']} steps x seeds {list(p['seeds'])}: "
                          + table))
    return claims


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


def claim_conversion(quick: bool) -> Claim:
    steps, uptrain = (80, 16) if quick else (300, 30)
    size = dict(d_model=64, n_heads=4, n_layers=2) if quick else dict(d_model=128, n_heads=4, n_layers=4)
    t = TrainConfig(steps=steps, batch_size=16, context=64, lr=1e-3, warmup=steps // 5, eval_every=steps,
                    eval_windows=32)
    mha_cfg = preset("llama-2024-small", n_kv_heads=size["n_heads"], max_seq_len=64, **size)
    mha = train(mha_cfg, t, None, progress=False)
    data = get_data(t)
    windows = D.eval_windows(data.val, t.context, t.eval_windows)
    converted = average_kv_heads(mha["model"], 1)  # all four query heads share one KV head: MQA
    at_conversion = evaluate(converted, windows)
    up = dataclasses.replace(t, steps=uptrain, warmup=max(1, uptrain // 5), eval_every=uptrain, lr=3e-4)
    uptrained = train(converted.cfg, up, None, progress=False, init_state=converted.state_dict())
    # The fair reference: the MHA model given the same extra steps.
    mha_more = train(mha_cfg, up, None, progress=False, init_state=mha["model"].state_dict())
    c = Claim("15.5.mha-to-gqa", "15.5", "an MHA model converts to fewer KV heads by averaging, then brief training",
              "close to MHA after brief training", unit="val loss, nats/char: MHA / converted / uptrained",
              measured=[round(mha_more["val_loss"], 4), round(at_conversion, 4), round(uptrained["val_loss"], 4)],
              tolerance="uptrained within 0.05 nats of MHA trained as long, and below the converted model")
    ok = uptrained["val_loss"] <= mha_more["val_loss"] + 0.05 and uptrained["val_loss"] < at_conversion
    return c.judge(ok, f"a {size['n_layers']}-layer width-{size['d_model']} model with {size['n_heads']} KV heads "
                   f"trained {steps} steps (val {mha['val_loss']:.4f}), its key and value heads averaged into one "
                   f"(MQA; Ainslie et al.'s mean-pooling): {at_conversion:.4f} right after conversion; after "
                   f"{uptrain} more steps ({uptrain / steps:.0%} of the original; Ainslie et al. use 5%) "
                   f"{uptrained['val_loss']:.4f}, against {mha_more['val_loss']:.4f} for the MHA model given the "
                   "same extra steps")


def run(quick: bool, out) -> list[Claim]:
    torch.manual_seed(0)
    return ablation_claims(quick, out) + [claim_conversion(quick)]

"""Two trained-model claims: train short / test long (15.2) and the token tracer (15.6).

Both run the project's own experiments (`llamablock.studies.long_context`, `llamablock.studies.trace`) and read
their results; --quick uses smaller models and fewer steps (stated in each record).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from llamablock.lab.record import Claim
from llamablock.studies import long_context, trace

TEXT = "ROMEO:\nBut soft, what light through yonder window breaks?"


# The ids of the claims this experiment records (for `llamablock lab --only`).
CLAIMS = (
    "15.2.long-context",
    "15.6.residual-stream",
)


def claim_long_context(quick: bool, out) -> Claim:
    p = (dict(L=16, steps=60, finetune_steps=10, windows=8, size=dict(d_model=64, n_layers=2))
         if quick else dict(L=64, steps=300, finetune_steps=40, windows=16))
    res = long_context.run_long_context(**p, log=None)
    L = res["L"]
    band = f"{4 * L}-{8 * L}"  # the far end of the longest evaluation
    far = {name: per[str(8 * L)][band] for name, per in res["summary"].items() if str(8 * L) in per and band in per[str(8 * L)]}
    near = res["summary"]["rope none"][str(L)][f"0-{L}"]
    best = min(far, key=far.get)
    c = Claim("15.2.long-context", "15.2", "trained at L, run at 8L: which position scheme degrades least",
              "ALiBi degrades gracefully; scaled RoPE recovers", measured={k: round(v, 3) for k, v in far.items()},
              unit=f"mean val loss at positions {band}, nats/char (within L: {near:.3f})",
              tolerance="ALiBi within 0.25 nats of its own loss inside L")
    if out is not None:
        long_context.plot(res, Path(out) / "long-context.png")
        c.plots = ["long-context.png"]
    alibi_in = res["summary"]["alibi"][str(L)][f"0-{L}"]
    graceful = far.get("alibi", float("inf")) <= alibi_in + 0.25
    return c.judge(graceful, f"{'quick: ' if quick else ''}models of {p.get('size') or long_context.SIZE} trained "
                   f"{p['steps']} steps at L = {L}; lowest loss at {band}: {best} ({far[best]:.3f}). ALiBi "
                   f"{alibi_in:.3f} inside L, {far.get('alibi', float('nan')):.3f} at {band}. Unscaled RoPE "
                   f"{far.get('rope none', float('nan')):.3f}. Fine-tuned variants are evaluated at "
                   f"{res['finetune_length']} only. " + " ".join(res["notes"]))


def claim_residual_stream(quick: bool, out) -> Claim:
    """Pre-LN: the stream grows block by block; post-LN: reset to mean 0, variance 1 after every add."""
    if quick:  # a short recipe in the report's folder, so the quick lab never waits on the full pair
        recipe = dataclasses.replace(trace.TRACE_RECIPE, steps=20, warmup=10, eval_every=20, eval_windows=8)
        result = trace.trace_pair(TEXT, Path(out) / "trace-cache" if out else None, recipe=recipe)
    else:
        result = trace.trace_pair(TEXT)
    old, new = result["models"]["2017"], result["models"]["2024"]
    after_ffn = [s for s in new["stages"] if s["name"].endswith("after feed-forward")]
    rms = [sum(s["rms"]) / len(s["rms"]) for s in after_ffn]  # mean over tokens
    grows = all(b > a for a, b in zip(rms, rms[1:]))
    normed = [s["normalized"] for s in old["stages"] if "normalized" in s]
    worst_mean = max(abs(m) for s in normed for m in s["mean"])
    worst_var = max(abs(v - 1) for s in normed for v in s["var"])
    c = Claim("15.6.residual-stream", "15.6", "pre-LN stream grows block by block; post-LN reset to mean 0, var 1",
              "grows / reset", measured={"2024 stream RMS by block": [round(r, 3) for r in rms],
                                         "2017 max |mean|": worst_mean, "2017 max |var - 1|": worst_var},
              tolerance="2024 RMS increasing; 2017 normalized |mean| < 1e-3 and variance in [0.98, 1]")
    if out is not None:
        trace.plot_pair(result, Path(out) / "tracer.png")
        c.plots = ["tracer.png"]
    # LayerNorm's output variance is exactly v / (v + eps) <= 1 for a stream of variance v: short of 1
    # by eps / (v + eps), which shows while v is still small (weights start at N(0, 0.02)).
    top = max(v for s in normed for v in s["var"])
    ok = grows and worst_mean < 1e-3 and worst_var <= 0.02 and top <= 1 + 1e-6
    return c.judge(ok, f"text {TEXT!r} through the trained pair ({old['steps']} steps each"
                   f"{', quick recipe' if quick else ''}): the 2024 model's stream RMS after each block "
                   f"{', '.join(f'{r:.2f}' for r in rms)} (mean over tokens); the 2017 model's LayerNorm output before "
                   f"its affine scale has |mean| <= {worst_mean:.1e} and |var - 1| <= {worst_var:.1e} per token (variance "
                   "v / (v + eps) with eps = 1e-5, never above 1). The "
                   "stream the 2017 model carries is that times its learned gamma plus beta, so its own variance "
                   "is the gammas', not exactly 1.")


def run(quick: bool, out) -> list[Claim]:
    return [claim_long_context(quick, out), claim_residual_stream(quick, out)]

"""Trained-model claims of 15.2 (train short, test long; fine-tuning after extension) and 15.6 (the
residual stream, through the token tracer).

Both run the project's own studies (`llamablock.studies.long_context`, `llamablock.studies.trace`)
and read their results. Long context has a precondition: a model that ignores position (a small
model trained briefly can) shows no difference between schemes, so when unscaled RoPE does not
degrade past L the long-context claims are "not measurable at this size" instead of passing by
default (the test: rescaling RoPE's frequencies must change the loss past L). Quick runs use smaller models and fewer steps; their verdicts are marked indicative.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from llamablock.lab.record import Claim
from llamablock.studies import long_context, trace

TEXT = "ROMEO:\nBut soft, what light through yonder window breaks?"
USES_POSITION = 0.02  # nats: rescaling RoPE must move the far loss at least this much for the claims to mean anything


# The ids of the claims this experiment records (for `llamablock lab --only`).
CLAIMS = (
    "15.2.long-context",
    "15.2.interpolation-finetune",
    "15.2.extensions-recover",
    "15.6.residual-stream",
)


def long_context_claims(quick: bool, out) -> list[Claim]:
    p = (dict(L=16, steps=60, finetune_steps=10, windows=8, size=dict(d_model=64, n_layers=2))
         if quick else dict(L=64, steps=300, finetune_steps=40, windows=16))
    res = long_context.run_long_context(**p, log=None)
    L, s = res["L"], res["summary"]
    far_band, ft = f"{4 * L}-{8 * L}", res["finetune_length"]
    ft_band = f"{ft // 2}-{ft}"
    inside = {name: per[str(L)][f"0-{L}"] for name, per in s.items() if str(L) in per}
    far = {name: per[str(8 * L)][far_band] for name, per in s.items() if str(8 * L) in per}
    at_ft = {name: per[str(ft)][ft_band] for name, per in s.items() if str(ft) in per and ft_band in per[str(ft)]}
    rope_in, rope_deg = inside["rope none"], far["rope none"] - inside["rope none"]
    alibi_deg = far["alibi"] - inside["alibi"]
    dims = {**long_context.SIZE, **(p.get("size") or {})}
    size = (f"models of width {dims['d_model']}, {dims['n_layers']} layers, trained {p['steps']} steps at L = {L}, "
            "one seed")
    table = [{"scheme": n, f"0-{L}": round(inside[n], 3) if n in inside else "", f"{ft_band} (at {ft})":
              round(at_ft[n], 3) if n in at_ft else "", f"{far_band} (at {8 * L})": round(far[n], 3) if n in far else ""}
             for n in s]
    rope_far = [v for n, v in far.items() if n.startswith("rope")]
    moved = max(rope_far) - min(rope_far)
    precondition = moved >= USES_POSITION
    why_not = (f"rescaling RoPE (none, linear, NTK, dynamic, YaRN) moves the loss at {far_band} by only {moved:.4f} "
               f"nats (< {USES_POSITION}): the model barely uses position at this size, so no scheme can be told apart")
    claims = []

    c = Claim("15.2.long-context", "15.2", "ALiBi degrades gracefully beyond its training length", "graceful",
              measured=round(alibi_deg, 3), unit=f"ALiBi loss rise from 0-{L} to {far_band}, nats/char",
              tolerance="at most half of unscaled RoPE's rise")
    c.table = table
    if out is not None:
        from llamablock.lab.plots import plot_long_context

        c.plots = plot_long_context(res, Path(out))
    detail = (f"{size}; loss rise past L: ALiBi {alibi_deg:+.3f}, unscaled RoPE {rope_deg:+.3f} nats/char. "
              + " ".join(res["notes"]))
    claims.append(c.judge(alibi_deg <= 0.5 * rope_deg, detail) if precondition else c.unmeasurable(why_not + ". " + detail))

    lin, lin_ft = at_ft["rope linear"], at_ft["rope linear + fine-tune"]
    c = Claim("15.2.interpolation-finetune", "15.2", "linear interpolation needs some fine-tuning",
              "fine-tuning needed", measured=[round(lin, 3), round(lin_ft, 3)],
              unit=f"loss at {ft_band} (length {ft}): interpolated / after fine-tuning, nats/char",
              tolerance="fine-tuning lowers the loss by more than 0.02 nats")
    detail = (f"{size}; rope_scaling linear with factor {ft // L} at {ft} tokens: {lin:.3f} before and {lin_ft:.3f} "
              f"after {res['finetune_steps']} fine-tuning steps at that length (inside L the model reaches {rope_in:.3f}).")
    claims.append(c.judge(lin - lin_ft > 0.02, detail) if precondition else c.unmeasurable(why_not + ". " + detail))

    yarn_ft = at_ft["rope yarn + fine-tune"]
    c = Claim("15.2.extensions-recover", "15.2", "RoPE's extensions recover long-context quality with modest fine-tuning",
              "recover", measured=round(yarn_ft - rope_in, 3),
              unit=f"YaRN + fine-tune at {ft_band} minus RoPE inside L, nats/char",
              tolerance="within 0.05 nats of the trained model's loss inside L, and below unscaled RoPE there")
    detail = (f"{size}; YaRN (factor {ft // L}) after {res['finetune_steps']} steps at {ft} tokens: {yarn_ft:.3f} at "
              f"{ft_band}, against {rope_in:.3f} inside L and {at_ft.get('rope none', float('nan')):.3f} for unscaled RoPE "
              "at the same positions without fine-tuning.")
    ok = yarn_ft - rope_in <= 0.05 and yarn_ft < at_ft.get("rope none", float("inf"))
    claims.append(c.judge(ok, detail) if precondition else c.unmeasurable(why_not + ". " + detail))
    if quick:
        for claim in claims:
            claim.indicative = "quick run: a 2-layer width-64 model, 60 steps at L = 16 (full: 4 layers, 300 steps at 64)"
    return claims


def claim_residual_stream(quick: bool, out) -> Claim:
    """Pre-LN: the stream grows block by block; post-LN: the stream itself (after LayerNorm's gain and
    shift, what the next block reads) is reset at every add. Criterion for 'reset': the post-LN
    stream's per-token mean within 0.1 of 0 and variance within 0.5-2 of 1 at every stage of every
    block, so it cannot grow; 'grows': the pre-LN stream's RMS rises at every block."""
    if quick:  # a short recipe in the report's folder, so the quick lab never waits on the full pair
        recipe = dataclasses.replace(trace.TRACE_RECIPE, steps=20, warmup=10, eval_every=20, eval_windows=8)
        result = trace.trace_pair(TEXT, Path(out) / "trace-cache" if out else None, recipe=recipe)
    else:
        result = trace.trace_pair(TEXT)
    old, new = result["models"]["2017"], result["models"]["2024"]
    after_ffn = [s for s in new["stages"] if s["name"].endswith("after feed-forward")]
    rms = [sum(s["rms"]) / len(s["rms"]) for s in after_ffn]  # mean over tokens
    grows = all(b > a for a, b in zip(rms, rms[1:], strict=False))
    post = [s for s in old["stages"] if s["name"].startswith("block ")]
    worst_mean = max(abs(m) for s in post for m in s["mean"])
    var_lo, var_hi = min(v for s in post for v in s["var"]), max(v for s in post for v in s["var"])
    reset = worst_mean <= 0.1 and 0.5 <= var_lo and var_hi <= 2.0
    # "the final RMSNorm cleans it up": after it, the stream's RMS is below the grown last block's
    final = [sum(s["rms"]) / len(s["rms"]) for s in new["stages"] if s["name"] == "final norm"]
    cleaned = bool(final) and bool(rms) and final[0] < rms[-1]
    c = Claim("15.6.residual-stream", "15.6", "pre-LN stream grows block by block; post-LN reset to mean 0, var 1",
              "grows / reset", measured={"2024 RMS by block": ", ".join(f"{r:.3f}" for r in rms),
                                         "2024 RMS after the final norm": round(final[0], 3) if final else None,
                                         "2017 max |mean|": round(worst_mean, 4),
                                         "2017 variance range": f"{var_lo:.3f}-{var_hi:.3f}"},
              tolerance="2024 RMS rising at every block and brought below the last block's by the final norm; 2017 "
                        "stream |mean| <= 0.1, variance in 0.5-2 at every stage")
    if out is not None:
        from llamablock.lab.plots import plot_tracer

        c.plots = plot_tracer(result, Path(out))
    return c.judge(grows and reset and cleaned, f"text {TEXT!r} through the trained pair ({old['steps']} steps each"
                   f"{', quick recipe' if quick else ''}): the 2024 model's stream RMS after each block "
                   f"{', '.join(f'{r:.2f}' for r in rms)} (mean over tokens), "
                   + (f"{final[0]:.2f} after the final RMSNorm ({'below' if cleaned else 'not below'} the last "
                      "block's: the module's 'the final RMSNorm cleans it up'). " if final else
                      "no final norm stage recorded. ")
                   + f"The 2017 model's stream, measured on the "
                   f"stream itself after every post-LN add and norm (gain and shift included): |mean| <= {worst_mean:.3f}, "
                   f"variance {var_lo:.3f}-{var_hi:.3f} per token. Exactly mean 0 and variance 1 holds only before the "
                   "learned gain and shift; the stream carries them, so 'reset' means brought back to a fixed scale, "
                   "which is what keeps it from growing.")


def run(quick: bool, out) -> list[Claim]:
    return long_context_claims(quick, out) + [claim_residual_stream(quick, out)]

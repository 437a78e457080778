"""Trained-model claims of 15.2 (train short, test long; fine-tuning after extension) and 15.6 (the
residual stream, through the token tracer).

Both run the project's own studies (`llamablock.studies.long_context`, `llamablock.studies.trace`)
and read their results. Long context has a precondition: a model that ignores position (a small
model trained briefly can) shows no difference between schemes, so when unscaled RoPE does not
degrade past L the long-context claims are "not measurable at this size" instead of passing by
default (the test: rescaling RoPE's frequencies must change the loss past L beyond the noise). The
evaluation window is the unit of every margin (the study keeps each curve window by window). Every
fine-tuned result is compared with a control, unscaled RoPE fine-tuned for the same steps, because
extra steps help any undertrained model. Quick runs use smaller models and fewer steps; their verdicts are marked indicative.
"""

from __future__ import annotations

import dataclasses
import statistics
from pathlib import Path

from llamablock.lab.details_text import said
from llamablock.lab.long_windows import band_means, difference, paired
from llamablock.lab.record import Claim
from llamablock.studies import long_context, trace

TEXT = "ROMEO:\nBut soft, what light through yonder window breaks?"


# The ids of the claims this experiment records (for `llamablock lab --only`).
CLAIMS = (
    "15.2.unscaled-rise",
    "15.2.long-context",
    "15.2.interpolation-finetune",
    "15.2.extensions-recover",
    "15.6.residual-stream",
)


# quick -> the long-context study's arguments
RECIPES = {True: dict(L=16, steps=60, finetune_steps=10, windows=8, size=dict(d_model=64, n_layers=2)),
           False: dict(L=64, steps=300, finetune_steps=40, windows=16)}


def long_context_claims(quick: bool, out) -> list[Claim]:
    """Judged window by window (`long_windows`): every difference is taken inside one evaluation
    window of the study, its margin twice the standard error over the windows. Precondition for
    all: the model uses position, i.e. rescaling RoPE's frequencies moves the loss at 4L-8L beyond
    that margin."""
    p = RECIPES[quick]
    res = long_context.run_long_context(**p, log=None)
    L, s = res["L"], res["summary"]
    far_band, ft = f"{4 * L}-{8 * L}", res["finetune_length"]
    ft_band = f"{ft // 2}-{ft}"
    inside = {name: per[str(L)][f"0-{L}"] for name, per in s.items() if str(L) in per}
    far = {name: per[str(8 * L)][far_band] for name, per in s.items() if str(8 * L) in per}
    at_ft = {name: per[str(ft)][ft_band] for name, per in s.items() if str(ft) in per and ft_band in per[str(ft)]}
    dims = {**long_context.SIZE, **(p.get("size") or {})}
    size = said("long size", width=dims["d_model"], layers=dims["n_layers"], steps=p["steps"], L=L)
    table = [{"scheme": n, f"0-{L}": round(inside[n], 3) if n in inside else "", f"{ft_band} (at {ft})":
              round(at_ft[n], 3) if n in at_ft else "", f"{far_band} (at {8 * L})": round(far[n], 3) if n in far else ""}
             for n in s]
    # uses position: the far loss under the rescaling that moves it most, against unscaled RoPE in the same windows
    moved = max((difference(res, {n: 1, "rope none": -1}, 8 * L, 4 * L, 8 * L)
                 for n in far if n.startswith("rope") and n != "rope none"), key=lambda m: abs(m[0]))
    uses_position = abs(moved[0]) > moved[1]

    # the rise within each 8L window: its positions 4L-8L against its own first L positions (the far
    # positions have more context, not less, so any rise is not the context's)
    def rise(name: str, length: int = 8 * L, lo: int = 4 * L) -> list[float]:
        far_w, in_w = band_means(res, name, length, lo, length), band_means(res, name, length, 0, L)
        return [f - i for f, i in zip(far_w, in_w, strict=True)]

    (rope_deg, rope_noise), windows = paired(rise("rope none")), len(res["window_curves"]["rope none"][str(8 * L)])
    rises = rope_deg > rope_noise
    why_not = said("long no position", band=far_band, moved=abs(moved[0]), margin=moved[1])
    no_rise = said("long no rise", rise=rope_deg, margin=rope_noise)
    claims = []

    c = Claim("15.2.unscaled-rise", "15.2", "RoPE trained at L, run far past L unscaled, loses quality", "rises",
              measured=round(rope_deg, 3),
              unit=f"unscaled RoPE loss at {far_band} minus at 0-{L} of the same {8 * L}-token windows, nats/char",
              tolerance="a rise beyond twice the standard error over the evaluation windows (paired within each)")
    detail = said("15.2.unscaled-rise", windows=windows, length=8 * L, band=far_band, L=L, rise=rope_deg, margin=rope_noise)
    claims.append(c.judge(rises, size, detail) if uses_position else c.unmeasurable(why_not, size, detail))

    alibi_rise = rise("alibi")
    alibi_deg = statistics.fmean(alibi_rise)
    graceful = paired([a - 0.5 * r for a, r in zip(alibi_rise, rise("rope none"), strict=True)])
    c = Claim("15.2.long-context", "15.2", "ALiBi degrades gracefully beyond its training length", "graceful",
              measured=round(alibi_deg, 3),
              unit=f"ALiBi loss rise from 0-{L} to {far_band} of the same {8 * L}-token windows, nats/char",
              tolerance="less than half of unscaled RoPE's rise ('gracefully': less than half as much), paired by "
                        "window, beyond twice the standard error over the windows; more than half beyond it differs")
    c.table = table
    if out is not None:
        from llamablock.lab.plots import plot_long_context

        c.plots = plot_long_context(res, Path(out))
    detail = said("15.2.long-context", alibi=alibi_deg, rope=rope_deg, graceful=graceful[0], margin=graceful[1])
    if not (uses_position and rises):
        claims.append(c.unmeasurable(why_not if not uses_position else no_rise, size, detail))
    elif abs(graceful[0]) <= graceful[1]:
        claims.append(c.unmeasurable(size, detail, said("15.2.long-context unsettled")))
    else:
        claims.append(c.judge(graceful[0] < 0, size, detail))

    # inside L, where the module puts interpolation's blur: past L the unscaled control meets unseen
    # angles, and what fine-tuning teaches it there is not the blur's repair
    def gain(before: str, after: str) -> list[float]:
        return [x - y for x, y in zip(band_means(res, before, ft, 0, L), band_means(res, after, ft, 0, L), strict=True)]

    lin_gain, ctrl_gain = gain("rope linear", "rope linear + fine-tune"), gain("rope none", "rope none + fine-tune")
    beyond = paired([a - b for a, b in zip(lin_gain, ctrl_gain, strict=True)])
    c = Claim("15.2.interpolation-finetune", "15.2", "linear interpolation needs some fine-tuning",
              "fine-tuning needed", measured=[round(statistics.fmean(lin_gain), 3), round(statistics.fmean(ctrl_gain), 3)],
              unit=f"loss gain inside L (positions 0-{L} of {ft}-token windows) from {res['finetune_steps']} "
                   "fine-tuning steps: interpolated / unscaled control, nats/char",
              tolerance="inside L the interpolated model gains more than the unscaled control given the same steps, "
                        "by more than twice the standard error over the evaluation windows (paired by window)")
    detail = said("15.2.interpolation-finetune", factor=ft // L, length=ft, L=L, steps=res["finetune_steps"],
                  linear=statistics.fmean(lin_gain), control=statistics.fmean(ctrl_gain), windows=len(lin_gain),
                  beyond=beyond[0], margin=beyond[1])
    claims.append(c.judge(beyond[0] > beyond[1], size, detail) if uses_position and rises
                  else c.unmeasurable(why_not if not uses_position else no_rise, size, detail))

    # within each ft-token window: unscaled RoPE's rise from its first L positions to ft/2-ft, and how
    # much of it YaRN after fine-tuning removes; the control is unscaled RoPE given the same steps
    penalty = rise("rope none", ft, ft // 2)
    removed = [a - b for a, b in zip(band_means(res, "rope none", ft, ft // 2, ft),
                                     band_means(res, "rope yarn + fine-tune", ft, ft // 2, ft), strict=True)]
    recovered = statistics.fmean(removed) / statistics.fmean(penalty) if statistics.fmean(penalty) > 0 else float("nan")
    yarn_vs_ctrl = difference(res, {"rope none + fine-tune": 1, "rope yarn + fine-tune": -1}, ft, ft // 2, ft)
    c = Claim("15.2.extensions-recover", "15.2", "RoPE's extensions recover long-context quality with modest fine-tuning",
              "recover", measured=round(recovered, 3),
              unit=f"share of unscaled RoPE's loss rise from 0-{L} to {ft_band} of the same {ft}-token windows that "
                   "YaRN + fine-tuning removes",
              tolerance="at least half removed ('recover': most of it), and below the unscaled control fine-tuned "
                        "the same steps by more than twice the standard error over the windows (paired by window)")
    detail = said("15.2.extensions-recover", factor=ft // L, steps=res["finetune_steps"], length=ft,
                  yarn=at_ft["rope yarn + fine-tune"], band=ft_band, none=at_ft["rope none"], L=L,
                  rise=statistics.fmean(penalty), share=recovered, control=at_ft["rope none + fine-tune"],
                  below=yarn_vs_ctrl[0], margin=yarn_vs_ctrl[1], windows=len(penalty))
    ok = statistics.fmean(penalty) > 0 and recovered >= 0.5 and yarn_vs_ctrl[0] > yarn_vs_ctrl[1]
    claims.append(c.judge(ok, size, detail) if uses_position and rises
                  else c.unmeasurable(why_not if not uses_position else no_rise, size, detail))
    if quick:
        full = RECIPES[False]
        for claim in claims:
            claim.indicative = [said("long quick", layers=dims["n_layers"], width=dims["d_model"], steps=p["steps"], L=L,
                                     full_layers=long_context.SIZE["n_layers"], full_steps=full["steps"],
                                     full_L=full["L"])]
    return claims


def _cv(values: list[float]) -> float:
    """Coefficient of variation: standard deviation over mean (0 for fewer than two values)."""
    return statistics.pstdev(values) / statistics.fmean(values) if len(values) > 1 else 0.0


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
    # "the final RMSNorm cleans it up": it brings every token to the same scale whatever the stream
    # grew to, so its output's per-token RMS varies (relative to its mean) less than the stream's
    final = [s["rms"] for s in new["stages"] if s["name"] == "final norm"]
    last = after_ffn[-1]["rms"] if after_ffn else []
    cleaned = bool(final) and len(last) > 1 and _cv(final[0]) < _cv(last)
    c = Claim("15.6.residual-stream", "15.6", "pre-LN stream grows block by block; post-LN reset to mean 0, var 1",
              "grows / reset", measured={"2024 RMS by block": ", ".join(f"{r:.3f}" for r in rms),
                                         "2024 per-token RMS variation, last block / final norm":
                                             f"{_cv(last):.3f} / {_cv(final[0]):.3f}" if final and len(last) > 1 else None,
                                         "2017 max |mean|": round(worst_mean, 4),
                                         "2017 variance range": f"{var_lo:.3f}-{var_hi:.3f}"},
              tolerance="2024 RMS rising at every block, and varying less from token to token after the final norm "
                        "than before it; 2017 stream |mean| <= 0.1, variance in 0.5-2 at every stage")
    if out is not None:
        from llamablock.lab.plots import plot_tracer

        c.plots = plot_tracer(result, Path(out))
    stream = said("15.6.residual-stream", text=TEXT, steps=old["steps"], quick=quick, rms=rms)
    final_line = (said("15.6.residual-stream final", final=sum(final[0]) / len(final[0]), cv_final=_cv(final[0]),
                       cv_last=_cv(last), cleaned=cleaned) if final and len(last) > 1
                  else said("15.6.residual-stream no final"))
    return c.judge(grows and reset and cleaned, stream, final_line,
                   said("15.6.residual-stream post-LN", mean=worst_mean, var_low=var_lo, var_high=var_hi))


def run(quick: bool, out) -> list[Claim]:
    return long_context_claims(quick, out) + [claim_residual_stream(quick, out)]

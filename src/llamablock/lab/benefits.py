"""15.6.ablation: each change of the 2024 block judged on the benefit the module names for it.

15.6: "Each detail makes training more stable, long contexts better behaved, or generation cheaper";
15.4 adds SwiGLU's lower loss. So each single-change variant of the ablation is judged on its own
benefit against the 2017 block, at equal parameters:
    RMSNorm before each sub-layer   more stable: its loss rises less than the 2017 block's at ten
                                    times the learning rate (the runs of 15.6.training-stability)
    GQA                             generation cheaper: fewer KV bytes per token, and its loss not
                                    worse than the 2017 block's by more than the noise
    SwiGLU                          lower loss than the ReLU 2017 block, beyond the noise
    RoPE                            long contexts: the learned table has no row past its length and
                                    RoPE is defined at any position; that holds by construction
                                    (15.1.learned-table-no-entry), so it is shown, not judged
The whole 2024 block against the 2017 one is shown beside. Reproduced when every judged change
shows its benefit, differs when one shows the opposite beyond the noise, else not measurable.
"""

from __future__ import annotations

from llamablock.lab.details_text import said
from llamablock.lab.record import DEFINITION, DIFFERS, NOT_MEASURABLE, REPRODUCED, Claim
from llamablock.lab.shared import _row
from llamablock.lab.shared import noise as shared_noise

STABLE = "2017 + RMSNorm pre-LN"  # the 2024 block's normalization: RMSNorm before each sub-layer


def _loss_change(records, summary, name: str) -> tuple[float, float]:
    delta = _row(summary, name)["val_loss"] - _row(summary, "2017")["val_loss"]
    noise, _ = shared_noise([(records, summary, name, 1), (records, summary, "2017", -1)])
    return delta, noise


def claim_ablation(records, summary, hot_records, hot, steps: int) -> Claim:
    c = Claim("15.6.ablation", "15.6", "each change makes training more stable, long contexts better behaved, or "
              "generation cheaper (SwiGLU: lower loss)", "each helps",
              unit="per change, its benefit against the 2017 block: loss rise at lr 1e-2 (RMSNorm pre-LN minus "
                   "2017), KV bytes per token ratio (GQA / 2017), loss change (SwiGLU); nats/char",
              tolerance="each judged change shows its benefit beyond the noise; one showing the opposite beyond the "
                        "noise differs")
    rows = []
    rise = {n: _row(hot, n)["val_loss"] - _row(summary, n)["val_loss"] for n in (STABLE, "2017")}
    noise, _ = shared_noise([(hot_records, hot, STABLE, 1), (records, summary, STABLE, -1),
                             (hot_records, hot, "2017", -1), (records, summary, "2017", 1)])
    gap = rise[STABLE] - rise["2017"]
    rows.append(("RMSNorm pre-LN", "more stable", "loss rise at lr 1e-2 minus the 2017 block's", gap, noise,
                 REPRODUCED if gap < -noise else DIFFERS if gap > noise else NOT_MEASURABLE))
    kv = _row(summary, "2017 + GQA")["kv_bytes_per_token"] / _row(summary, "2017")["kv_bytes_per_token"]
    delta, gqa_noise = _loss_change(records, summary, "2017 + GQA")
    rows.append(("GQA", "generation cheaper", "KV bytes per token, GQA / 2017", kv, gqa_noise,
                 DIFFERS if kv >= 1 or delta > gqa_noise else REPRODUCED))
    delta_swiglu, noise = _loss_change(records, summary, "2017 + SwiGLU")
    rows.append(("SwiGLU", "lower loss", "loss change", delta_swiglu, noise,
                 REPRODUCED if delta_swiglu < -noise else DIFFERS if delta_swiglu > noise else NOT_MEASURABLE))
    rope_delta, rope_noise = _loss_change(records, summary, "2017 + RoPE")
    rows.append(("RoPE", "long contexts", "loss change inside the context (shown; the benefit is by construction)",
                 rope_delta, rope_noise, DEFINITION))
    whole, whole_noise = _loss_change(records, summary, "2024")
    variant = {"RMSNorm pre-LN": STABLE, "GQA": "2017 + GQA", "SwiGLU": "2017 + SwiGLU", "RoPE": "2017 + RoPE"}
    by_variant = {variant[ch]: (b, v, vd) for ch, b, _, v, _, vd in rows}
    c.table = [{"variant": r["variant"], "params": r["params"], "KV B/token": r["kv_bytes_per_token"],
                "seeds": r["seeds"], "val loss": round(r["val_loss"], 4), "sd": round(r["val_std"], 4) if r["seeds"] > 1
                else "", "vs 2017": round(r["delta_vs_2017"] or 0.0, 4),
                "benefit judged": by_variant.get(r["variant"], ("",))[0],
                "its figure": round(by_variant[r["variant"]][1], 4) if r["variant"] in by_variant else "",
                "verdict": by_variant.get(r["variant"], ("", "", ""))[2]} for r in summary]
    c.measured = {ch: round(v, 4) for ch, _, _, v, _, vd in rows if vd != DEFINITION}
    judged = [(ch, vd) for ch, _, _, _, _, vd in rows if vd != DEFINITION]
    seeds = _row(summary, "2017")["seeds"]
    _, how = shared_noise([(records, summary, "2024", 1),
                           (records, summary, "2017", -1)])
    details = [said("15.6.ablation", steps=steps, seeds=seeds)]
    by = {ch: (v, n, vd) for ch, _, _, v, n, vd in rows}
    details += [said("15.6.ablation RMSNorm pre-LN", value=by["RMSNorm pre-LN"][0], noise=by["RMSNorm pre-LN"][1],
                     verdict=by["RMSNorm pre-LN"][2]),
                said("15.6.ablation GQA", value=by["GQA"][0], verdict=by["GQA"][2]),
                said("15.6.ablation SwiGLU", value=by["SwiGLU"][0], noise=by["SwiGLU"][1], verdict=by["SwiGLU"][2])]
    details += [said("15.6.ablation rest", gqa=delta, gqa_noise=gqa_noise, whole=whole, whole_noise=whole_noise), how]
    if any(vd == DIFFERS for _, vd in judged):
        return c.judge(False, *details, said("15.6.ablation differs", changes=[ch for ch, vd in judged if vd == DIFFERS]))
    if all(vd == REPRODUCED for _, vd in judged):
        return c.judge(True, *details)
    return c.unmeasurable(*details, said("15.6.ablation unsettled",
                                         changes=[ch for ch, vd in judged if vd == NOT_MEASURABLE]))

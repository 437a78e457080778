"""report.md: a short paper, one part per section of the module, each claim with the module's
figure, the measured one, the verdict and how it was measured, then what the section's results
mean. Numbers are printed to the precision their comparison needs (`fmt`), structured values
as small tables, never as Python reprs."""

from __future__ import annotations

from collections import Counter

from llamablock.lab.record import DEFINITION, DIFFERS, NOT_MEASURABLE, REPRODUCED, Claim

SECTIONS = {  # section: (title, what it measures); what the results mean is written from them (`meaning`)
    "15.1": (
        "Rotary position embedding",
        ("RoPE rotates each query and key pair by position times frequency; the module proves the score then "
         "depends only on the gap m - n. Every rotation below goes through the library's own RoPE, in float32."),
    ),
    "15.2": (
        "Stretching RoPE, and ALiBi",
        ("Which RoPE pairs reach angles unseen in training when a 4,096-token model runs at 32,768, what each "
         "context-extension method does to them, ALiBi's slopes, and small models trained short and run long."),
    ),
    "15.3": (
        "RMSNorm",
        ("RMSNorm drops LayerNorm's mean and shift. Parameters and outputs are checked exactly; speed is timed "
         "on one thread with both layers written the same way; quality is trained with the norm's placement "
         "fixed."),
    ),
    "15.4": (
        "SwiGLU",
        ("The gated feed-forward layer, the 8/3 width rule and what it keeps equal, and quality at equal size."),
    ),
    "15.5": (
        "Grouped-query attention",
        ("Cache sizes against the bytes llamablock's KVCache allocates; GQA against MHA with copied key/value "
         "heads on both attention paths; the parameter law; decode speed on one thread; conversion from MHA."),
    ),
    "15.6": (
        "The 2017 and the 2024 block",
        ("The module's table in this project's two presets, the residual stream through trained models, and "
         "the two blocks trained at equal parameters."),
    ),
    "exercises": (
        "Exercises",
        ("Each exercise of the module answered by the code, the module's answer beside it."),
    ),
    "beyond": (
        "Beyond the module: what came next",
        ("Not claims of the module: the two changes the block's descendants made (q/k norm in Qwen3 and Gemma 3, "
         "sandwich norms in Gemma 2 and 3), each trained as one change to the 2024 block and judged on the "
         "claim its authors made. Counted apart from the module's claims."),
    ),
}

# What a claim's outcome means, one sentence per outcome, used only when that outcome is the run's:
# claim id -> (if reproduced, if it differs). {measured} and {module} are the claim's figures.
READINGS = {
    "15.1.rotation-identity": ("RoPE's score depends only on the gap m - n, as the module proves",
                               "RoPE's score here is not a function of the gap alone ({measured})"),
    "15.1.rope-head-offset": ("a head's float32 scores stay within the rounding float32 allows, also moved 500 tokens "
                              "and near position 20,000",
                              "a head's float32 scores leave the rounding float32 allows"),
    "15.1.learned-table-shift": ("the trained learned table moves the same pair's score when the pair moves ({measured}), "
                                 "more than 1e5 times RoPE's change",
                                 "the trained learned table's shift ({measured}) does not stand 1e5 times above RoPE's"),
    "15.2.ntk-wording": ("NTK-aware scaling leaves the fast pairs alone, as the module words it",
                         "measured pair by pair, NTK-aware scaling also slows fast pairs the module says it leaves "
                         "alone"),
    "15.2.unscaled-rise": ("unscaled RoPE run past its training length loses quality ({measured} nats)",
                           "unscaled RoPE did not lose quality past its training length here ({measured} nats)"),
    "15.2.long-context": ("ALiBi's loss rise past L ({measured} nats) is at most half of unscaled RoPE's",
                          "ALiBi's loss rise past L ({measured} nats) is more than half of unscaled RoPE's"),
    "15.2.interpolation-finetune": ("fine-tuning helps the interpolated model more than the same steps help unscaled "
                                    "RoPE (gains {measured})",
                                    "fine-tuning helped the interpolated model no more than the same steps help "
                                    "unscaled RoPE (gains {measured})"),
    "15.2.extensions-recover": ("YaRN with brief fine-tuning removes {measured} of unscaled RoPE's long-context rise "
                                "and beats the fine-tuned control",
                                "YaRN with brief fine-tuning did not recover long-context quality beyond the "
                                "fine-tuned control (share removed {measured})"),
    "15.3.speed-fused": ("compiled, RMSNorm takes {measured} of a three-pass LayerNorm's time, inside the module's "
                         "10-15% saving at every width",
                         "compiled, RMSNorm takes {measured} of a three-pass LayerNorm's time, outside the module's "
                         "10-15% saving at some width"),
    "15.3.training-quality": ("the model with RMSNorm trained about as well as with LayerNorm ({measured} nats)",
                              "the model with RMSNorm trained worse than with LayerNorm ({measured} nats)"),
    "15.4.gate-closes": ("the library's SwiGLU unit closes when its gate input is large and negative",
                         "the library's SwiGLU unit does not close as Swish(gate) x up says"),
    "15.4.training-quality": ("SwiGLU reached a lower loss than the ungated layers at equal size ({measured} nats)",
                              "SwiGLU did not beat the ungated layers at equal size here ({measured} nats)"),
    "15.5.gqa-equals-mha": ("GQA computes what MHA with copied key/value heads computes, bit for bit at h_kv = h_q",
                            "GQA does not compute what MHA with copied key/value heads computes ({measured})"),
    "15.5.decode-speed": ("on this CPU the smaller cache shows as speed: 32 -> 8 KV heads decodes {measured}x "
                          "faster, within the module's 3-4x widened by the spread",
                          "on this CPU 32 -> 8 KV heads decodes {measured}x faster, outside the module's 3-4x"),
    "15.5.training-quality": ("GQA's loss stayed within the noise of MHA's and below MQA's (GQA - MHA, MQA - GQA: "
                              "{measured})",
                              "GQA's loss was not both close to MHA's and below MQA's (GQA - MHA, MQA - GQA: "
                              "{measured})"),
    "15.5.mha-to-gqa": ("an MHA model averaged into GQA and trained briefly recovers and ends below the control "
                        "(gap to MHA at conversion, after: {measured})",
                        "an MHA model averaged into GQA and trained briefly does not both recover and beat the "
                        "control (gap to MHA at conversion, after: {measured})"),
    "15.6.residual-stream": ("with pre-LN the stream grows block by block until the final RMSNorm, and post-LN "
                             "resets it",
                             "the stream does not show pre-LN growth, the final norm's clean-up and post-LN reset"),
    "15.6.ablation": ("the 2024 block trained at least as well as the 2017 one ({measured} nats)",
                      "the 2024 block did not train as well as the 2017 one ({measured} nats)"),
    "15.6.training-stability": ("at ten times the learning rate the 2024 block held up better (rises {measured})",
                                "at ten times the learning rate the 2024 block did not hold up better (rises "
                                "{measured})"),
}


def fmt(v) -> str:
    """A value to the precision its comparison needs: integers with thousands separators, floats to 4
    decimals (trailing zeros dropped) or 3 significant digits in e-notation when tiny or huge."""
    if isinstance(v, bool) or v is None:
        return str(v)
    if isinstance(v, int):
        return f"{v:,}"
    if isinstance(v, float):
        if v == 0:
            return "0"
        if abs(v) < 1e-3 or abs(v) >= 1e7:
            return f"{v:.3g}"
        return f"{v:.4f}".rstrip("0").rstrip(".")
    if isinstance(v, (list, tuple)):
        return ", ".join(fmt(x) for x in v)
    if isinstance(v, dict):
        return "; ".join(f"{k}: {fmt(x)}" for k, x in v.items())
    return str(v)


def _cell(v) -> str:
    return fmt(v).replace("|", "\\|").replace("\n", " ")


def _verdict(c: Claim) -> str:
    return f"**{c.verdict}**" + (" (indicative)" if c.indicative else "")


def headline(claims: list[Claim]) -> str:
    beyond = [c for c in claims if c.section == "beyond"]
    claims = [c for c in claims if c.section != "beyond"]
    counts = Counter(c.verdict for c in claims)
    measured = [v for v in (REPRODUCED, DIFFERS, NOT_MEASURABLE) if counts[v]]
    text = (f"{len(claims)} claims: " + ", ".join(f"{counts[v]} {v}" for v in measured)
            + (f"; and {counts[DEFINITION]} definition{'s' if counts[DEFINITION] != 1 else ''} (true by construction, "
               "shown but not counted as reproduced)"
               if counts[DEFINITION] else "") + ".")
    indicative = sum(1 for c in claims if c.indicative)
    if indicative:
        text += f" {indicative} of the verdicts are indicative only (the reason is given with each)."
    if beyond:
        other = Counter(c.verdict for c in beyond)
        text += (f" Beyond the module, {len(beyond)} more: " + ", ".join(f"{n} {v}" for v, n in other.most_common())
                 + ".")
    return text


def _decimals(column: list) -> int | None:
    """The decimals a column of floats needs: the most that `fmt` gives any of them, so 2.79 prints as
    2.790 beside 2.949 and a column reads at one precision. None when a value is in e-notation."""
    places = 0
    for v in column:
        if isinstance(v, float) and v == v:  # NaN (v != v) prints blank
            text = fmt(v)
            if "e" in text:
                return None
            places = max(places, len(text.partition(".")[2]))
    return places


def _table(rows: list[dict]) -> list[str]:
    """A structured value as a markdown table; floats aligned to one precision per column, a missing or NaN
    entry blank (not measured there)."""
    keys = list(rows[0])
    places = {k: _decimals([r.get(k) for r in rows]) for k in keys}

    def cell(k, v):
        if isinstance(v, float) and v != v:
            return ""
        if isinstance(v, float) and places[k] is not None:
            return f"{v:.{places[k]}f}"
        return _cell("" if v is None else v)

    return (["| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
            + ["| " + " | ".join(cell(k, r.get(k, "")) for k in keys) + " |" for r in rows])


def _names(part: list[Claim]) -> str:
    return ", ".join(f"`{c.id}`" for c in part)


def _figure(v, width: int = 48) -> str:
    text = fmt(v)
    return text if len(text) <= width else text[: width - 1] + "…"


def meaning(section: str, part: list[Claim], quick: bool, missing: list[str] = ()) -> str:
    """What this section's results mean, written from them: which claims reproduced, differed, were not
    measurable or are definitions, the reading of each key claim for the outcome it had (READINGS),
    what rests on the quick run only, and which of the section's claims this run did not measure. A
    sentence that another outcome would make false is never written."""
    by = {v: [c for c in part if c.verdict == v] for v in (REPRODUCED, DIFFERS, NOT_MEASURABLE, DEFINITION)}
    judged = len(by[REPRODUCED]) + len(by[DIFFERS])
    text = [f"**What this means.** Of {len(part)} claim{'s' if len(part) != 1 else ''} measured here, "
            f"{len(by[REPRODUCED])} reproduced, {len(by[DIFFERS])} differ"
            f"{'s' if len(by[DIFFERS]) == 1 else ''}, {len(by[NOT_MEASURABLE])} could not be judged and "
            f"{len(by[DEFINITION])} hold{'s' if len(by[DEFINITION]) == 1 else ''} by construction."]
    if judged and not by[DIFFERS]:
        text.append("Every claim that could be judged here reproduced.")
    said = []
    for c in by[REPRODUCED] + by[DIFFERS]:
        if c.id in READINGS:
            template = READINGS[c.id][0 if c.verdict == REPRODUCED else 1]
            said.append(template.format(measured=_figure(c.measured), module=_figure(c.source_value)))
    if said:
        text.append("In this run: " + "; ".join(said) + ".")
    if by[DIFFERS]:
        text.append("Differs: " + "; ".join(f"`{c.id}`, module {_figure(c.source_value)}, measured "
                                             f"{_figure(c.measured)}" for c in by[DIFFERS])
                    + ". Each says in its details how it differs and why it may.")
    if by[NOT_MEASURABLE]:
        one = len(by[NOT_MEASURABLE]) == 1
        text.append(f"Not measurable here: {_names(by[NOT_MEASURABLE])}; the details give the reason, and "
                    f"{'it says' if one else 'these say'} nothing for or against the statement{'' if one else 's'}.")
    if by[DEFINITION]:
        text.append(f"{_names(by[DEFINITION])} hold{'s' if len(by[DEFINITION]) == 1 else ''} by construction and "
                    "is shown, not counted." if len(by[DEFINITION]) == 1 else
                    f"{_names(by[DEFINITION])} hold by construction and are shown, not counted.")
    reasons: dict[str, list[Claim]] = {}
    for c in part:
        if c.indicative:
            reasons.setdefault(c.indicative, []).append(c)
    for reason, group in reasons.items():
        text.append(f"Indicative only, not evidence either way ({reason}): {_names(group)}.")
    if missing:
        text.append(f"This run did not record {', '.join(f'`{i}`' for i in missing)}, so nothing here speaks "
                    f"for or against {'that statement' if len(missing) == 1 else 'those statements'}.")
    return " ".join(text)


def render_report(claims: list[Claim], env: dict, quick: bool, timings: dict[str, float] | None = None,
                  declared: dict[str, list[str]] | None = None) -> str:
    """The report. `declared`: section -> the claim ids the lab's experiments declare for it, so that a
    paragraph can say which of them this run did not record (runner.declared)."""
    lines = [
        "# The LLaMA Block, measured",
        "",
        (f"llamablock lab{' --quick' if quick else ''}, {env['date']}; Python {env['python']}, torch {env['torch']}, "
         f"{' '.join(x for x in (env['machine'], env['processor']) if x)}, {env['threads']} "
         f"thread{'s' if env['threads'] != 1 else ''} (timing claims run on one)."),
        "",
        headline(claims),
        "",
        ("Verdicts: *reproduced* (agrees within the stated tolerance), *differs* (does not; the details say why it "
         "may), *not measurable here* (the measurement cannot decide: a spread larger than the effect, a model too "
         "small to use what is measured), *definition* (holds by construction). Timings come from this machine, on "
         "one thread, as ratios of interleaved calls with their spread; the module's were measured on other "
         "hardware."),
        "",
    ]
    if quick:
        lines += [("With --quick the claims that need training rest on small models, few steps and one seed, and "
                   "are marked indicative. `llamablock lab` without --quick trains larger models for longer, with "
                   "three seeds."), ""]
    for section, (title, intro) in SECTIONS.items():
        part = [c for c in claims if c.section == section]
        if not part:
            continue
        lines += [f"## {section} {title}" if section.startswith("15.") else f"## {title}", "", intro, "",
                  "| id | claim | module | measured | verdict |", "|---|---|---|---|---|"]
        lines += [f"| `{c.id}` | {_cell(c.claim)} | {_cell(c.source_value)} | {_cell(c.measured)}"
                  f"{(' (' + _cell(c.unit) + ')') if c.unit else ''} | {_verdict(c)} |" for c in part]
        lines.append("")
        for c in part:
            details = c.details + ("." if c.details and not c.details.endswith((".", "!", "?")) else "")
            lines += [f"- `{c.id}` ({c.tolerance or 'no tolerance'}): {details}"
                      + (f" *Indicative: {c.indicative}.*" if c.indicative else "")]
            if c.table:
                lines += [""] + ["  " + row for row in _table(c.table)] + [""]
            lines += [f"\n  ![{c.id}]({p})" for p in c.plots]
        recorded = {c.id for c in part}
        missing = [i for i in (declared or {}).get(section, []) if i not in recorded]
        lines += ["", meaning(section, part, quick, missing), ""]
    if timings:
        lines += ["## Run", "", "| experiment | seconds |", "|---|---|"]
        lines += [f"| {title} | {sec:.1f} |" for title, sec in timings.items()] + [""]
    return "\n".join(lines)

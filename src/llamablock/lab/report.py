"""report.md: a short paper, one part per section of the module, each claim with the module's
figure, the measured one, the verdict and how it was measured, then what the section's results
mean. Numbers are printed to the precision their comparison needs (`fmt`), structured values
as small tables, never as Python reprs."""

from __future__ import annotations

from collections import Counter

from llamablock.lab.record import DEFINITION, DIFFERS, NOT_MEASURABLE, REPRODUCED, Claim

SECTIONS = {  # section: (title, what it measures, what its results mean)
    "15.1": (
        "Rotary position embedding",
        ("RoPE rotates each query and key pair by position times frequency; the module proves the score then "
         "depends only on the gap m - n. Every rotation below goes through the library's own RoPE, in float32."),
        ("The identity is exact in algebra and holds in float32 to rounding that grows with the absolute "
         "position; a learned table moves the score by orders of magnitude more, and has no row past its "
         "length."),
    ),
    "15.2": (
        "Stretching RoPE, and ALiBi",
        ("Which RoPE pairs reach angles unseen in training when a 4,096-token model runs at 32,768, what each "
         "context-extension method does to them, ALiBi's slopes, and small models trained short and run long."),
        ("The frequency claims are closed forms of the library's code and agree with the module, except its "
         "wording about NTK-aware scaling: measured pair by pair, NTK slows most fast pairs too. The trained "
         "claims need a model that uses position; when a small model does not, they are not measurable here."),
    ),
    "15.3": (
        "RMSNorm",
        ("RMSNorm drops LayerNorm's mean and shift. Parameters and outputs are checked exactly; speed is timed "
         "on one thread with both layers written the same way; quality is trained with the norm's placement "
         "fixed."),
        ("The parameter and correlation claims hold exactly. Speed depends on how the layers are written: only "
         "the like-for-like timing speaks to the 10-15% claim, and only when its spread is below the effect."),
    ),
    "15.4": (
        "SwiGLU",
        ("The gated feed-forward layer, the 8/3 width rule and what it keeps equal, and quality at equal size."),
        ("Values, gate, widths, parameters and arithmetic follow from the library's layers exactly. The "
         "quality claim is a trained comparison at a small size and short budget; see its details."),
    ),
    "15.5": (
        "Grouped-query attention",
        ("Cache sizes against the bytes llamablock's KVCache allocates; GQA against MHA with copied key/value "
         "heads on both attention paths; the parameter law; decode speed on one thread; conversion from MHA."),
        ("GQA is MHA with tied key/value heads (to float32 rounding on every path), and the cache shrinks "
         "exactly with the KV heads. Whether that shows as speed depends on whether reading the cache "
         "dominates on this CPU, which the decode claim checks before judging."),
    ),
    "15.6": (
        "The 2017 and the 2024 block",
        ("The module's table in this project's two presets, the residual stream through trained models, and "
         "the two blocks trained at equal parameters."),
        ("The presets carry every row of the module's table; the stream measurements show pre-LN growth and "
         "post-LN reset; the trained comparison is small-scale evidence, stated with its seed spread."),
    ),
    "exercises": (
        "Exercises",
        ("Each exercise of the module answered by the code, the module's answer beside it."),
        ("Every numeric exercise is computed by the library's own functions; the recall question is a "
         "definition."),
    ),
    "beyond": (
        "Beyond the module: what came next",
        ("Not claims of the module: the two changes the block's descendants made (q/k norm in Qwen3 and Gemma 3, "
         "sandwich norms in Gemma 2 and 3), each trained as one change to the 2024 block and judged on the "
         "claim its authors made. Counted apart from the module's claims."),
        ("Both changes target instabilities that grow with scale; a small model shows them only if the 2024 block "
         "itself suffers at the high learning rate, which each verdict checks first."),
    ),
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


def meaning(section: str, part: list[Claim]) -> str:
    counts = Counter(c.verdict for c in part)
    said = SECTIONS[section][2]
    tally = ", ".join(f"{n} {v}" for v, n in counts.most_common())
    odd = [c.id for c in part if c.verdict in (DIFFERS, NOT_MEASURABLE)]
    text = f"**What this means.** {said} Here: {tally}."
    if odd:
        text += " Each " + ("of " if len(odd) > 1 else "") + ", ".join(f"`{i}`" for i in odd) + \
                " says in its details what was measured and why it may differ from the module."
    return text


def render_report(claims: list[Claim], env: dict, quick: bool, timings: dict[str, float] | None = None) -> str:
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
    for section, (title, intro, _) in SECTIONS.items():
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
        lines += ["", meaning(section, part), ""]
    if timings:
        lines += ["## Run", "", "| experiment | seconds |", "|---|---|"]
        lines += [f"| {title} | {sec:.1f} |" for title, sec in timings.items()] + [""]
    return "\n".join(lines)

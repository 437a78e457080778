"""report.md: a short paper, one part per section of the module, each claim with the module's
figure, the measured one, the verdict and how it was measured."""

from __future__ import annotations

from collections import Counter

from llamablock.lab.record import Claim

SECTIONS = {
    "15.1": ("Rotary position embedding",
             "RoPE rotates each query and key pair by position times frequency; the module proves the score then "
             "depends only on the gap m - n. Every rotation below goes through the library's own RoPE, in float32."),
    "15.2": ("Stretching RoPE, and ALiBi",
             "Which RoPE pairs reach angles unseen in training when a 4,096-token model runs at 32,768, and what each "
             "context-extension method does to them."),
    "15.3": ("RMSNorm", "RMSNorm drops LayerNorm's mean and shift. Parameters and outputs are checked exactly; speed "
                        "is measured on this machine, where it depends on how the layers are written."),
    "15.4": ("SwiGLU", "The gated feed-forward layer and the 8/3 width rule that keeps its size equal."),
    "15.5": ("Grouped-query attention", "Cache sizes are checked against the bytes llamablock's KVCache allocates; "
                                        "GQA against a textbook MHA; decode speed on this CPU."),
    "15.6": ("The 2017 and the 2024 block", "The two small presets of this project, side by side."),
    "exercises": ("Exercises", "Each exercise of the module answered by the code, the module's answer beside it."),
}


def _fmt(v) -> str:
    """A table cell: numbers to 4 significant digits, pipes escaped so the row stays one row."""
    text = f"{v:.4g}" if isinstance(v, float) else str(v)
    return text.replace("|", "\\|")


def render_report(claims: list[Claim], env: dict, quick: bool) -> str:
    counts = Counter(c.verdict for c in claims)
    lines = [
        "# The LLaMA Block, measured",
        "",
        f"llamablock lab{' --quick' if quick else ''}, {env['date']}; Python {env['python']}, torch {env['torch']}, "
        f"{' '.join(x for x in (env['machine'], env['processor']) if x)}, {env['threads']} threads.",
        "",
        f"{len(claims)} claims: " + ", ".join(f"{n} {v}" for v, n in counts.most_common()) + ".",
        "Timings come from this machine, interleaved in one process and reported as ratios; the module's were "
        "measured on other hardware, so a different speed ratio is a finding about this machine, not an error.",
        "",
    ]
    if quick:
        lines += ["With --quick the claims that need training rest on a few dozen steps of small models and one "
                        "seed: their verdicts are indicative only. `llamablock lab` without --quick trains longer, "
                        "with three seeds.", ""]
    for section, (title, intro) in SECTIONS.items():
        part = [c for c in claims if c.section == section]
        if not part:
            continue
        lines += [f"## {section if section != 'exercises' else ''} {title}".replace("##  ", "## "), "", intro, "",
                  "| id | claim | module | measured | verdict |", "|---|---|---|---|---|"]
        lines += [f"| `{c.id}` | {_fmt(c.claim)} | {_fmt(c.source_value)} | {_fmt(c.measured)}{(' ' + _fmt(c.unit)) if c.unit else ''} "
                  f"| **{c.verdict}** |" for c in part]
        lines.append("")
        for c in part:
            lines += [f"- `{c.id}` ({c.tolerance or 'no tolerance'}): {c.details}"]
            lines += [f"\n  ![{c.id}]({p})" for p in c.plots]
        lines.append("")
    return "\n".join(lines)

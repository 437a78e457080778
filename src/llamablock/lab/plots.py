"""Figures for the report, through llamablock.util.plots (Agg backend, PNGs written atomically).

The trained studies' figures (ablation, tracer, long context) are the studies' own plots written
into the report's folder, so the report shows what the study draws. The RoPE-scaling figure is
the lab's own (`plot_unseen`): it plots the quantity the unseen-angle criterion of
`diagnostics.rope_table` tests, so its circles and its threshold line say the same thing as the
table. Sections draw their small figures with `new_figure` and `save`.
"""

from __future__ import annotations

from pathlib import Path

from llamablock.util.plots import figure, pyplot, save_png


def new_figure(width: float = 7.0, height: float = 3.6):
    return figure(width, height)


def save(fig, out: Path | None, name: str) -> list[str]:
    """Save as out/name and close; returns [name] for Claim.plots, or [] when out is None."""
    if out is None:
        pyplot().close(fig)
        return []
    save_png(fig, Path(out) / name)
    return [name]


def plot_ablation(records: list[dict], summary: list[dict], out: Path | None, name: str = "ablation.png") -> list[str]:
    """The ablation study's own plot (llamablock.studies.ablation.plot_compare), into the report."""
    if out is None:
        return []
    from llamablock.studies.ablation import plot_compare

    plot_compare(records, summary, Path(out) / name)
    return [name]


def plot_tracer(result: dict, out: Path | None, name: str = "tracer.png") -> list[str]:
    """The tracer's own plot (llamablock.studies.trace.plot_pair: stages aligned by name), into the report."""
    if out is None:
        return []
    from llamablock.studies.trace import plot_pair

    plot_pair(result, Path(out) / name)
    return [name]


def plot_long_context(result: dict, out: Path | None, name: str = "long-context.png") -> list[str]:
    """The long-context study's own plot (llamablock.studies.long_context.plot), into the report."""
    if out is None:
        return []
    from llamablock.studies.long_context import plot

    plot(result, Path(out) / name)
    return [name]


def plot_unseen(methods: list[dict], train_len: int, target_len: int, out: Path | None,
                name: str = "rope-scaling.png") -> list[str]:
    """Each pair's view of the target length, T / ratio_i in trained tokens, per method
    (rope_table.compare_methods records). rope_table's criterion: a pair reaches unseen angles when
    it is slower than L (right of the dotted line: its wavelength exceeds L) and T / ratio_i > L
    (above the solid line). Circled points are the records' own `unseen_at_target` flags, which
    therefore lie exactly in that corner."""
    fig, ax = new_figure(9, 5.5)
    styles = {"default": "k-", "linear": "C0--", "ntk": "C1-.", "dynamic": "C4:", "yarn": "C2-", "llama3": "C3:"}
    for m in methods:
        pairs = m["pairs"]
        style = styles.get(m["method"], "C5-")
        ax.plot([p["pair"] for p in pairs], [p["target_in_trained_tokens"] for p in pairs], style, lw=1.5,
                label=f"{m['label']} ({len(m['unseen_pairs'])} unseen)")
        bad = [p for p in pairs if p["unseen_at_target"]]
        if bad:
            ax.plot([p["pair"] for p in bad], [p["target_in_trained_tokens"] for p in bad], "o", mfc="none",
                    color=style[:2] if style[0] == "C" else "k", ms=6)
    first_slow = next((p["pair"] for p in methods[0]["pairs"] if p["wavelength"] > train_len), None)
    ax.axhline(train_len, color="grey", lw=1)
    ax.text(0, train_len * 1.1, f"L = {train_len:,}: above it, a slow pair turns past anything trained", color="grey")
    if first_slow is not None:
        ax.axvline(first_slow - 0.5, color="grey", lw=1, ls=":")
        ax.text(first_slow, train_len * 0.8, "slower than L →", color="grey")
    ax.set_yscale("log")
    ax.set_xlabel("pair index i (fast -> slow)")
    ax.set_ylabel(f"T / ratio_i: T = {target_len:,} as the pair sees it, in trained tokens")
    ax.set_title("RoPE pairs at the target length: circled pairs reach angles unseen in training", fontsize=10)
    ax.legend(fontsize=8, loc="lower left")
    return save(fig, out, name)

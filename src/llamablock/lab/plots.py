"""Figures for the report, through llamablock.util.plots (Agg backend, PNGs written atomically).

The lab draws its own versions of the studies' figures where the report needs them to say
exactly what was run: the seed count in the ablation's title, tracer stages aligned by name
(the 2017 model has a "+ positions" stage the 2024 model lacks), one legend per panel.
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


def plot_ablation(records: list[dict], summary: list[dict], out: Path, name: str = "ablation.png") -> list[str]:
    """Validation curves (mean over the seeds run) and final losses with their seed spread."""
    fig, (a, b) = figure(12, 4.5, ncols=2, dpi=100)
    seeds = max(r["seeds"] for r in summary)
    for row in summary:
        curves = [r["val_curve"] for r in records if r["variant"] == row["variant"]]
        steps = [s for s, _ in curves[0]]
        a.plot(steps, [sum(c[i][1] for c in curves) / len(curves) for i in range(len(steps))], "o-", ms=3,
               label=row["variant"])
    a.set(xlabel="step", ylabel="validation loss (nats/char)",
          title=f"mean over {seeds} seeds" if seeds > 1 else "one seed")
    a.legend(fontsize=7)
    names = [r["variant"] for r in summary]
    b.bar(range(len(names)), [r["val_loss"] for r in summary],
          yerr=[r["val_std"] for r in summary] if seeds > 1 else None, capsize=4)
    lo = min(r["val_loss"] - r["val_std"] for r in summary)
    hi = max(r["val_loss"] + r["val_std"] for r in summary)
    pad = 0.25 * (hi - lo + 1e-3)
    b.set_ylim(lo - pad, hi + pad)  # a zoomed axis: the title says so
    b.set_xticks(range(len(names)), names, rotation=30, ha="right", fontsize=8)
    b.set(ylabel="final validation loss",
          title="equal parameters, equal steps (axis zoomed; bars: ± 1 sd)" if seeds > 1 else
          "equal parameters, equal steps (axis zoomed; one seed, no spread)")
    return save(fig, out, name)


def plot_tracer(result: dict, out: Path, name: str = "tracer.png", token: int = -1) -> list[str]:
    """RMS and variance of the stream per stage, both models on one axis of stage names, so that
    'block 1 after attention' is the same x for both (a stage a model lacks is simply absent)."""
    order: list[str] = []
    for m in result["models"].values():
        for s in m["stages"]:
            if s["name"] != "logits" and s["name"] not in order:
                order.append(s["name"])
    # "+ positions" belongs right after the embeddings; blocks in order; the final norm last.
    order.sort(key=lambda n: (0, 0) if n == "embeddings" else (1, 0) if n == "+ positions" else
               (3, 0) if n == "final norm" else (2, _stage_key(n)))
    x = {n: i for i, n in enumerate(order)}
    fig, axes = figure(12, 4.5, ncols=2, dpi=100)
    for arch, m in result["models"].items():
        stages = [s for s in m["stages"] if s["name"] in x]
        xs = [x[s["name"]] for s in stages]
        axes[0].plot(xs, [s["rms"][token] for s in stages], "o-", label=f"{arch} ({m['preset']})")
        axes[1].plot(xs, [s["var"][token] for s in stages], "o-", label=f"{arch} ({m['preset']})")
    for ax in axes:
        ax.set_xticks(range(len(order)), order, rotation=60, ha="right", fontsize=7)
        ax.legend(fontsize=8)
    axes[0].set(ylabel="RMS of the residual stream", yscale="log", title="stream size by stage (last token)")
    axes[1].set(ylabel="variance over features", yscale="log", title="variance by stage (last token)")
    return save(fig, out, name)


def _stage_key(name: str) -> tuple[int, int]:
    """'block 3 after feed-forward' -> (3, 1)."""
    parts = name.split()
    return int(parts[1]), 0 if "attention" in name else 1


def plot_long_context(result: dict, out: Path | None, name: str = "long-context.png") -> list[str]:
    """The long-context study's own plot (llamablock.studies.long_context.plot), into the report."""
    if out is None:
        return []
    from llamablock.studies.long_context import plot

    plot(result, Path(out) / name)
    return [name]

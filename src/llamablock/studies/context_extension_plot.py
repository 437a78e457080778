"""The plot of `llamablock rope eval`: mean loss by position, one line per method, the trained
context L marked, the reference's 95% interval across documents shaded."""

from __future__ import annotations

from pathlib import Path

from llamablock.util.plots import figure, save_png


def plot_losses(result: dict, path: str | Path) -> Path:
    """`result` as `llamablock rope eval --json` prints it."""
    fig, ax = figure(8.0, 4.2)
    for method, m in result["methods"].items():
        x = [(b["start"] + b["end"]) / 2 for b in m["bins"]]
        y = [b["nll"] for b in m["bins"]]
        if method == "reference":
            if all(b["nll_low"] is not None for b in m["bins"]):
                ax.fill_between(x, [b["nll_low"] for b in m["bins"]], [b["nll_high"] for b in m["bins"]],
                                color="0.8", label="reference, 95% interval")
            ax.plot(x, y, color="0.3", linewidth=2.5, label="reference (own window, sliding)")
        else:
            ax.plot(x, y, marker=".", linewidth=1.2, label=method)
    ax.axvline(result["trained_context"], color="k", linestyle="--", linewidth=0.8)
    ax.text(result["trained_context"], ax.get_ylim()[1], " L", va="top")
    ax.set_xlabel("position (tokens of context seen - 1)")
    ax.set_ylabel("loss, nats per token (bin mean)")
    ax.set_title(f"{Path(result['model']).name}: {result['tokens']:,} tokens, factor {result['factor']:g}, "
                 f"{len(result['documents'])} documents", fontsize=9)
    ax.legend(fontsize=7, ncol=2)
    return save_png(fig, path)

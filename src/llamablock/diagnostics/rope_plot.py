"""The figure of section 15.2: each RoPE pair's wavelength under every scaling method.

`res` is what `llamablock rope` builds: {"train_len", "target_len", "head_dim", "base",
"methods": rope_table.compare_methods(...) records}. Used by the command (--plot) and the lab.
"""

from __future__ import annotations

from pathlib import Path

from llamablock.util.plots import figure, save_png


def plot_wavelengths(res: dict, path: str | Path) -> None:
    """Wavelength per pair for each method (log scale), L and T marked; unseen pairs circled.
    Written atomically (llamablock.util.plots)."""
    path = Path(path)
    if path.suffix.lower() != ".png":
        raise ValueError(f"--plot needs a .png file name, got {path}")
    if not path.parent.exists():
        raise FileNotFoundError(f"folder for --plot does not exist: {path.parent}")
    fig, ax = figure(9, 5.5, dpi=120)
    styles = {"default": "k-", "linear": "C0--", "ntk": "C1-.", "dynamic": "C4:", "yarn": "C2-", "llama3": "C3:",
              "config": "C5-"}  # "config": the --config file's own scaling, when it has one
    for m in res["methods"]:
        x = [p["pair"] for p in m["pairs"]]
        ax.plot(x, [p["scaled_wavelength"] for p in m["pairs"]], styles[m["method"]], lw=1.6,
                label=f"{m['label']} ({len(m['unseen_pairs'])} unseen, {len(m['crowded_pairs'])} crowded)")
        bad = [p for p in m["pairs"] if p["unseen_at_target"]]
        if bad:
            ax.plot([p["pair"] for p in bad], [p["scaled_wavelength"] for p in bad], "o", mfc="none",
                    color=styles[m["method"]][:2] if m["method"] != "default" else "k", ms=6)
    ax.axhline(res["train_len"], color="grey", lw=1)
    ax.text(0, res["train_len"] * 1.15, f"training length L = {res['train_len']}", color="grey")
    ax.axhline(res["target_len"], color="grey", lw=1, ls="--")
    ax.text(0, res["target_len"] * 1.15, f"target length T = {res['target_len']}", color="grey")
    ax.set_yscale("log")
    ax.set_xlabel("pair index i (fast -> slow)")
    ax.set_ylabel("wavelength 2π/θ_i in tokens (as seen at T)")
    ax.set_title(f"RoPE pairs, head width {res['head_dim']}, base {res['base']:g}: circles reach angles unseen "
                 "in training", fontsize=10)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(0, 0.93))
    save_png(fig, path)

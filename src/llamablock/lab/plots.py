"""Figures for the report: matplotlib with the Agg backend (no display), written atomically."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from llamablock.io.hf_checkpoint import atomic_write  # noqa: E402


def new_figure(width: float = 7.0, height: float = 3.6):
    return plt.subplots(figsize=(width, height), dpi=110)


def save(fig, out: Path | None, name: str) -> list[str]:
    """Save as out/name and close; returns [name] for Claim.plots, or [] when out is None."""
    if out is None:
        plt.close(fig)
        return []
    fig.tight_layout()
    atomic_write(Path(out) / name, lambda p: fig.savefig(p, format="png"))
    plt.close(fig)
    return [name]

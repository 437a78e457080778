"""Figures for the report, through llamablock.util.plots (Agg backend, PNGs written atomically)."""

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

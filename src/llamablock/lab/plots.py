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

"""matplotlib for files, not screens: the Agg backend, and PNGs written atomically.

Every plot of the package (training curves, the ablation table, long-context curves, the tracer,
RoPE wavelengths, the lab report) is made with `figure` and written with `save_png`.
"""

from __future__ import annotations

from pathlib import Path

from llamablock.util.files import atomic_write


def pyplot():
    """matplotlib.pyplot on the Agg backend (no display needed), imported on first use."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def figure(width: float = 7.0, height: float = 3.6, ncols: int = 1, nrows: int = 1, dpi: int = 110):
    """(fig, axes) of the given size in inches."""
    return pyplot().subplots(nrows, ncols, figsize=(width, height), dpi=dpi)


def save_png(fig, path: str | Path, dpi: int | None = None) -> Path:
    """Lay out, write `fig` to `path` as PNG atomically, and close it."""
    path = Path(path)
    try:
        fig.tight_layout()
        atomic_write(path, lambda p: fig.savefig(p, format="png", dpi=dpi or fig.dpi))
    finally:
        pyplot().close(fig)
    return path

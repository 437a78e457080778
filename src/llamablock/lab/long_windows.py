"""The paired margins over evaluation windows that 15.2's trained claims are judged with.

`studies.long_context.run_long_context` keeps every curve window by window (`window_curves`). A
margin over the positions of the curve averaged over windows would count the loss-by-position
trend as noise and ignore that neighbouring positions share a window; the unit of sampling is the
window (as `shared.window_noise` pairs the ablation's claims). So each comparison here is a
difference taken inside one window, its margin twice the standard error over the windows.
"""

from __future__ import annotations

import math
import statistics


def band_means(res: dict, name: str, length: int, lo: int, hi: int) -> list[float]:
    """Each window's mean loss over positions [lo, hi) of curve (name, length)."""
    return [statistics.fmean(w[lo:hi]) for w in res["window_curves"][name][str(length)]]


def paired(diffs: list[float]) -> tuple[float, float]:
    """Mean of per-window differences and twice its standard error (a two-sided 95% margin)."""
    margin = 2 * statistics.stdev(diffs) / math.sqrt(len(diffs)) if len(diffs) > 1 else float("inf")
    return statistics.fmean(diffs), margin


def difference(res: dict, terms: dict[str, float], length: int, lo: int, hi: int) -> tuple[float, float]:
    """`paired` over windows of sum(weight x band mean) of curves at `length`, positions [lo, hi):
    terms {name: weight}, e.g. {"a": 1, "b": -1} for a - b in the same windows."""
    per = [band_means(res, name, length, lo, hi) for name in terms]
    return paired([sum(w * x for w, x in zip(terms.values(), xs, strict=True)) for xs in zip(*per, strict=True)])

"""The long-context study with its loss curves kept window by window, and the paired margins over
windows that 15.2's trained claims are judged with.

`studies.long_context.run_long_context` returns each curve averaged over its evaluation windows;
a margin over the positions of that average counts the loss-by-position trend as noise and ignores
that neighbouring positions share a window. The unit of sampling is the window (as
`shared.window_noise` pairs the ablation's claims), so `run_with_windows` records each window's
curve as the study evaluates it: for the run's duration it stands in for the study's
`loss_by_position` with the same computation that keeps the windows, and afterwards matches each
kept array to the curve it averages to (the same sums, so equal to the last bit). When the study
returns per-window curves itself this wrapper goes.
"""

from __future__ import annotations

import math
import statistics

import torch
import torch.nn.functional as F

from llamablock.studies import long_context


@torch.no_grad()
def window_losses(model, ids: torch.Tensor, length: int, windows: int = 16, batch: int = 4) -> torch.Tensor:
    """(windows, length) next-token loss of each of `windows` evenly spaced windows, float64: the windows
    and the arithmetic of long_context.loss_by_position, which averages this over its first axis."""
    model.eval()
    starts = torch.linspace(0, len(ids) - length - 2, windows).long().tolist()
    rows = []
    for i in range(0, len(starts), batch):
        w = torch.stack([ids[s: s + length + 1] for s in starts[i: i + batch]])  # (b, length + 1)
        logits = model(w[:, :-1])
        loss = F.cross_entropy(logits.flatten(0, 1).float(), w[:, 1:].flatten(), reduction="none")
        rows.append(loss.view(len(w), length).double())
    return torch.cat(rows)


def _study_mean(per: torch.Tensor, batch: int) -> list[float]:
    """The mean over windows summed batch by batch, as loss_by_position sums it (so equal to the bit)."""
    total = torch.zeros(per.shape[1], dtype=torch.float64)
    for i in range(0, per.shape[0], batch):
        total += per[i: i + batch].sum(0)
    return (total / per.shape[0]).tolist()


def run_with_windows(**kwargs) -> dict:
    """run_long_context(**kwargs), plus result["window_curves"][name][str(length)]: the (windows,
    length) losses whose mean over windows is result["curves"][name][str(length)]."""
    kept: list[tuple[torch.Tensor, int]] = []
    real = long_context.loss_by_position

    def keeping(model, ids, length, windows=16, batch=4):
        per = window_losses(model, ids, length, windows, batch)
        kept.append((per, batch))
        return _study_mean(per, batch)

    long_context.loss_by_position = keeping
    try:
        res = long_context.run_long_context(**kwargs)
    finally:
        long_context.loss_by_position = real
    res["window_curves"] = {}
    for name, per in res["curves"].items():
        for n, curve in per.items():
            match = [k for k, b in kept if _study_mean(k, b) == curve]
            if not match:
                raise RuntimeError(f"no per-window losses average to the study's curve {name!r} at {n}")
            res["window_curves"].setdefault(name, {})[n] = match[0].tolist()
    return res


def band_means(res: dict, name: str, length: int, lo: int, hi: int) -> list[float]:
    """Each window's mean loss over positions [lo, hi) of curve (name, length)."""
    return [statistics.fmean(w[lo:hi]) for w in res["window_curves"][name][str(length)]]


def paired(diffs: list[float]) -> tuple[float, float]:
    """Mean of per-window differences and twice its standard error (a two-sided 95% margin)."""
    margin = 2 * statistics.stdev(diffs) / math.sqrt(len(diffs)) if len(diffs) > 1 else float("inf")
    return statistics.fmean(diffs), margin

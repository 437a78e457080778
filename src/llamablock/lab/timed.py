"""Timing for the lab's speed claims: one thread, interleaved rounds, a ratio with its spread.

A two-core machine shared with anything else rounds multi-threaded calls to the scheduler's
tick, so every timing claim runs on one thread (`one_thread`, restored afterwards) unless the
claim is about threads. The competitors are called in turn within each round, so a change in
load hits both; each round gives one ratio, and the spread is the half-width of the middle
half of those ratios (interquartile range / 2). `judge_ratio` turns a ratio into a verdict:
not measurable here when the spread is larger than the effect (the distance from 1), else
reproduced when the claimed range, widened by the spread, holds the median ratio.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from contextlib import contextmanager

import torch

from llamablock.lab.record import Claim
from llamablock.util.timing import interleaved


@contextmanager
def one_thread():
    """torch on one intra-op thread inside the block; the previous count restored after."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def rounds(fns: dict[str, Callable[[], object]], repeats: int, warmup: int = 2) -> dict[str, list[float]]:
    """Seconds per call of each zero-argument callable, `repeats` interleaved rounds."""
    return interleaved(fns, repeats, warmup)


def ratio(samples: dict[str, list[float]], num: str, den: str) -> dict:
    """Median of the per-round ratios num / den, and their spread (interquartile range / 2)."""
    r = sorted(a / b for a, b in zip(samples[num], samples[den], strict=True))
    q = statistics.quantiles(r, n=4) if len(r) >= 2 else [r[0]] * 3
    return {"median": statistics.median(r), "spread": (q[2] - q[0]) / 2, "rounds": len(r),
            "ms": (statistics.median(samples[num]) * 1e3, statistics.median(samples[den]) * 1e3)}


def judge_ratio(c: Claim, r: dict, low: float, high: float, details: str) -> Claim:
    """Verdict for a time ratio claimed to lie in [low, high] (1 = no effect)."""
    c.measured = round(r["median"], 3)
    details += f" Median of {r['rounds']} per-round ratios {r['median']:.3f}, spread ± {r['spread']:.3f}."
    if r["spread"] >= abs(r["median"] - 1):
        return c.unmeasurable(details + " The spread is at least the effect, so the sign of the effect is not "
                                        "settled on this machine: not measurable here.")
    ok = low - r["spread"] <= r["median"] <= high + r["spread"]
    return c.judge(ok, details + ("" if ok else f" Outside {low:g}-{high:g} by more than the spread: on this CPU, "
                                  "measured like for like, the effect has another size. A speed ratio belongs to the "
                                  "hardware and kernels it was measured on; the module's came from others."))

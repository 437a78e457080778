"""Timing for the lab's speed claims: one thread, interleaved rounds, a median ratio with its interval.

A two-core machine shared with anything else rounds multi-threaded calls to the scheduler's
tick, so every timing claim runs on one thread (`one_thread`, restored afterwards) unless the
claim is about threads. The competitors are called in turn within each round, the order rotated
from round to round, so a change in load, and any cost of a position in the round, hits each of
them alike; each round gives one ratio.

Two figures come from those per-round ratios, and each has one use:
- the spread, half the interquartile range: how much one round scatters. It does not shrink with
  more rounds, so it only gates: when it is at least the effect (the median's distance from 1),
  the sign of the effect is not settled on this machine and the claim is not measurable here.
- a 95% interval of the median, a bootstrap over rounds (seeded, so a rerun on the same samples
  gives the same interval). It narrows as rounds are added, and it is what the module's band is
  widened by: reproduced when the interval meets the band, differs when it lies wholly outside.
  An interval that holds 1 (no effect) also leaves the claim not measurable.
"""

from __future__ import annotations

import random
import statistics
import time
from collections.abc import Callable
from contextlib import contextmanager

import torch

from llamablock.lab.details_text import said
from llamablock.lab.record import DIFFERS, NOT_MEASURABLE, REPRODUCED, Claim

BOOTSTRAP = 2000  # resamples of the rounds; the interval's ends move by well under its width between seeds
LEVEL = 0.95


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
    """Seconds per call of each zero-argument callable, `repeats` interleaved rounds. Rounds 2j and
    2j + 1 start at callable j mod k and the odd one runs backwards, so each callable takes every
    position about equally often (a reversal alone kept the middle one of three in the middle)."""
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    names = list(fns)
    samples: dict[str, list[float]] = {n: [] for n in names}
    for r in range(repeats):
        turn = (r // 2) % len(names)
        order = names[turn:] + names[:turn]
        for name in (order if r % 2 == 0 else order[::-1]):
            t0 = time.perf_counter()
            fns[name]()
            samples[name].append(time.perf_counter() - t0)
    return samples


def median_interval(values: list[float], seed: int = 0) -> tuple[float, float]:
    """A 95% percentile-bootstrap interval of the median of `values` (resampling the rounds)."""
    rng = random.Random(seed)
    n = len(values)
    meds = sorted(statistics.median(rng.choices(values, k=n)) for _ in range(BOOTSTRAP))
    tail = (1 - LEVEL) / 2
    return meds[int(tail * BOOTSTRAP)], meds[int((1 - tail) * BOOTSTRAP) - 1]


def ratio(samples: dict[str, list[float]], num: str, den: str) -> dict:
    """Per-round ratios num / den: their median, its 95% interval, and their spread (IQR / 2)."""
    r = sorted(a / b for a, b in zip(samples[num], samples[den], strict=True))
    q = statistics.quantiles(r, n=4) if len(r) >= 2 else [r[0]] * 3
    return {"median": statistics.median(r), "interval": median_interval(r), "spread": (q[2] - q[0]) / 2,
            "rounds": len(r), "ms": (statistics.median(samples[num]) * 1e3, statistics.median(samples[den]) * 1e3)}


def verdict(r: dict, low: float, high: float) -> str:
    """'reproduced', 'differs' or 'not measurable here' for a ratio claimed in [low, high] (1 = no effect)."""
    lo, hi = r["interval"]
    if r["spread"] >= abs(r["median"] - 1) or lo <= 1 <= hi:
        return NOT_MEASURABLE
    return REPRODUCED if lo <= high and hi >= low else DIFFERS


def describe(r: dict) -> dict:
    """The ratio's figures as the details say them."""
    lo, hi = r["interval"]
    return said("ratio", rounds=r["rounds"], median=r["median"], low=lo, high=hi, spread=r["spread"])


def judge_ratio(c: Claim, r: dict, low: float, high: float, *details: dict) -> Claim:
    """Verdict for a time ratio claimed to lie in [low, high] (1 = no effect); `details` are said() entries."""
    c.measured = round(r["median"], 3)
    lines = [*details, describe(r)]
    found = verdict(r, low, high)
    if found == NOT_MEASURABLE:
        return c.unmeasurable(*lines, said("ratio unsettled"))
    if high == float("inf"):
        return c.judge(found == REPRODUCED, *lines, said("ratio above" if found == REPRODUCED else "ratio not above",
                                                        low=low))
    return c.judge(found == REPRODUCED, *lines, said("ratio in band" if found == REPRODUCED else "ratio outside band",
                                                    low=low, high=high))

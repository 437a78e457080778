"""Side-by-side timing for the lab and the benchmarks: min and median over repeats, and the best
of repeated calls with the caches warm (back to back) or cold (a large read before each call).

Speed is only ever reported as measured here, never asserted: the machine is shared, so the
competitors are timed interleaved in one process and compared as ratios.
"""

from __future__ import annotations

import statistics
import time
from typing import Callable

import torch


def interleaved(fns: dict[str, Callable[[], object]], repeats: int = 20, warmup: int = 3) -> dict[str, list[float]]:
    """Seconds per call of each zero-argument callable over `repeats` rounds, the callables in turn
    within each round, so that a change in the machine's load hits all of them. Every other round
    runs them in reverse order: in a fixed order, the position alone shifted the ratio of two
    LayerNorm calls steadily, which a ratio would read as an effect of the code."""
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    samples: dict[str, list[float]] = {name: [] for name in fns}
    order = list(fns.items())
    for round_ in range(repeats):
        for name, fn in (order if round_ % 2 == 0 else order[::-1]):
            t0 = time.perf_counter()
            fn()
            samples[name].append(time.perf_counter() - t0)
    return samples


def time_calls(fns: dict[str, Callable[[], object]], repeats: int = 20, warmup: int = 3) -> dict[str, dict]:
    """Time each zero-argument callable, interleaving them round by round. Seconds per call."""
    samples = interleaved(fns, repeats, warmup)
    return {name: {"min": min(s), "median": statistics.median(s), "repeats": len(s)} for name, s in samples.items()}


def l3_size() -> str:
    """This CPU's last-level cache as Linux reports it (e.g. "32 MiB"), for reports."""
    try:
        with open("/sys/devices/system/cpu/cpu0/cache/index3/size") as f:
            size = f.read().strip()  # e.g. "32768K"
    except OSError:
        return "size unknown"
    return f"{int(size[:-1]) >> 10} MiB" if size.endswith("K") else size


def eviction_buffer(nbytes: int = 1 << 30):
    """A float32 buffer of `nbytes` for `best_time(..., evict=...)`. 1 GiB by default: larger
    than the last-level cache even of server CPUs with hundreds of MiB of L3 (`l3_size()` reports
    this one's), so reading it pushes a call's inputs out of the caches."""
    return torch.ones(nbytes // 4)


def best_time(fn: Callable[[], object], repeats: int, evict=None) -> float:
    """Best of `repeats` calls, in seconds, after one warm-up call. With `evict` (a tensor from
    `eviction_buffer`), read it before each call, so that the call's inputs come from memory
    and not from the caches ("cold"); without it the calls run back to back ("warm").
    Reading, not writing: written lines would leave the caches dirty and each call would pay
    their write-back as well, which blurs the differences being measured (a written buffer
    shrinks the KV-head ratios that `llamablock bench attention` measures)."""
    fn()
    best = float("inf")
    for _ in range(repeats):
        if evict is not None:
            evict.sum()
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best

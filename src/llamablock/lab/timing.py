"""Side-by-side timing for the lab and the benchmarks: min and median over repeats.

Speed is only ever reported as measured here, never asserted: the machine is shared, so the
competitors are timed interleaved in one process and compared as ratios.
"""

from __future__ import annotations

import statistics
import time
from typing import Callable


def time_calls(fns: dict[str, Callable[[], object]], repeats: int = 20, warmup: int = 3) -> dict[str, dict]:
    """Time each zero-argument callable, interleaving them round by round. Seconds per call."""
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    samples: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            samples[name].append(time.perf_counter() - t0)
    return {name: {"min": min(s), "median": statistics.median(s), "repeats": len(s)} for name, s in samples.items()}

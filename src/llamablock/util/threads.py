"""How many threads torch's intra-op pool gets by default on the command line.

Half the CPU cores this process may run on, at least one. A parallel region waits for its
slowest thread, so on a machine where other processes hold cores, more threads than free cores
make every op wait for a descheduled thread; half the cores leaves room for one busy neighbour
per pair (`llamablock bench threads` measures decode by thread count, idle and with a core held).
"""

from __future__ import annotations

import os


def available_cores() -> int:
    """The CPU cores this process may run on (its affinity mask where the OS has one)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def default_threads() -> int:
    return max(1, available_cores() // 2)

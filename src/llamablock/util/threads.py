"""How many threads torch's intra-op pool gets by default on the command line.

The physical cores this process may run on, as llama.cpp defaults to: a decode step's matmuls
split their rows over the threads, and a second hardware thread of a core shares that core's
vector units and caches, so it adds little; a thread per physical core uses every unit once.
The default serves a user's machine, where the command has the cores to itself; on a shared
machine, `--threads` sets fewer (`llamablock bench threads` measures decode by thread count, idle
and with a core held by another process).
"""

from __future__ import annotations

import os
from pathlib import Path

TOPOLOGY = Path("/sys/devices/system/cpu")  # Linux: cpuN/topology/{physical_package_id,core_id}


def available_cores() -> int:
    """The CPUs this process may run on (its affinity mask where the OS has one), hardware threads
    counted apart."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def physical_cores(topology: Path = TOPOLOGY) -> int:
    """The physical cores among the CPUs this process may run on: hardware threads of one core
    (SMT siblings) count once. Read from Linux's sysfs topology; where it is absent (macOS, whose
    Apple cores have no SMT, or a container that hides it), the available CPUs."""
    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else range(os.cpu_count() or 1)
    cores = set()
    for cpu in cpus:
        where = topology / f"cpu{cpu}" / "topology"
        try:
            cores.add(((where / "physical_package_id").read_text().strip(), (where / "core_id").read_text().strip()))
        except OSError:
            return available_cores()
    return max(1, len(cores))


def default_threads() -> int:
    return physical_cores()

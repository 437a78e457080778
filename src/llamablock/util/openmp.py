"""OpenMP's wait between parallel regions, for a process that computes from a second thread (serve).

GCC's OpenMP runtime (libgomp: torch's, and the block kernel's in llamablock.fast.kernels) lets a
team's threads spin for a while after a parallel region, so the next region starts at once. It
counts every thread of every team the process has made, idle ones included, and once they
outnumber the CPUs it cuts the spin to 100 rounds (libgomp's GOMP_SPINCOUNT documentation):
threads then sleep and are woken by the kernel at every region. `llamablock serve` loads the model
in its main thread (a team of its own) and steps it in the scheduler's thread (another), so on a
2-core machine a decode step of ~100 regions (fast/decode_step.py) ran several times slower there
than the same step in `generate` (`llamablock bench serve` shows the served rate beside the
engine's own step, timed outside the server). OMP_WAIT_POLICY=ACTIVE
lifts that cut to 1000 rounds, enough to bridge the gaps between a step's regions, and
GOMP_SPINCOUNT=300000, libgomp's own default, keeps ACTIVE from spinning without end in a process
that is not over its CPUs. The runtime reads both when it loads, so they must be set before torch
is imported; a value the user set is kept.
"""

from __future__ import annotations

import os
from typing import MutableMapping

SETTINGS = {"OMP_WAIT_POLICY": "ACTIVE", "GOMP_SPINCOUNT": "300000"}


def keep_spinning(env: MutableMapping[str, str] = os.environ) -> bool:
    """Set SETTINGS in `env` where the user set neither; True when they were set here."""
    if any(name in env for name in SETTINGS):
        return False
    env.update(SETTINGS)
    return True

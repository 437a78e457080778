"""glibc's return-and-refault of large buffers, and llamablock.fast.kernels.malloc's fix.

LayerNorm over a (2048, 4096) float32 tensor allocates a 32 MiB output per call; glibc serves
it with mmap and unmaps it on free, so every call faults fresh zeroed pages in. The fix
(`llamablock.fast.kernels.malloc.tune_allocator`, applied by the command line) makes glibc keep the memory.
mallopt cannot be undone within a process, so the two settings run in child processes started
alternately (defaults, tuned, defaults, tuned, ...), each timing the same loop; min and median
are over all rounds of a setting.
"""

from __future__ import annotations

import os
import statistics

from benchmarks.common import Section, ms, run_child

NAME = "malloc"
CLAIM = "LayerNorm (2048, 4096): 11.9 ms with glibc defaults vs 2.9 ms without return-and-refault"

CHILD = r"""
import json, sys, torch
if sys.argv[1] == "tuned":
    from llamablock.fast.kernels.malloc import tune_allocator
    state = tune_allocator()
else:
    state = "glibc defaults"
from llamablock.util.timing import time_calls
rows, width, repeats = int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
ln, x = torch.nn.LayerNorm(width), torch.randn(rows, width)
with torch.no_grad():
    r = time_calls({"ln": lambda: ln(x)}, repeats=repeats, warmup=2)["ln"]
print(json.dumps({"min": r["min"], "median": r["median"], "state": state}))
"""


def _child(mode: str, rows: int, width: int, repeats: int) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}  # defaults really default
    env.pop("LD_PRELOAD", None)
    return run_child(CHILD, mode, str(rows), str(width), str(repeats), env=env)


def run(quick: bool = False) -> list[Section]:
    rows, width = 2048, 4096  # 32 MiB: above glibc's largest dynamic mmap threshold, even in --quick
    rounds, repeats = (1, 3) if quick else (3, 15)
    got = {"defaults": [], "tuned": []}
    for _ in range(rounds):
        for mode in got:
            got[mode].append(_child(mode, rows, width, repeats))
    sec = Section(f"LayerNorm over ({rows}, {width}) float32, child processes alternated",
                  ["allocator", "min ms", "median of medians ms", "speed-up"])
    med = {m: statistics.median(r["median"] for r in rs) for m, rs in got.items()}
    for mode, rs in got.items():
        sec.rows.append([rs[0]["state"], ms(min(r["min"] for r in rs)), ms(med[mode]),
                         f"{med['defaults'] / med[mode]:.2f}x"])
    sec.notes.append("`llamablock ...` applies the tuned setting at start-up (llamablock.cli.main); "
                     "`import llamablock` does not.")
    return [sec]

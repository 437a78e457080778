"""What every benchmark returns, and the helpers they share.

A benchmark module has NAME, CLAIM (the sentence of the module or issue it measures) and
`run(quick: bool) -> list[Section]`. A Section is one table: its rows are already formatted
strings, so the runner only lays them out (markdown for BENCHMARKS.md, the same text on stdout).
Times are seconds from `llamablock.util.timing.time_calls`: competitors interleaved round by
round in one process, min and median over repeats; ratios are taken between medians.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import torch


@dataclass
class Section:
    title: str
    headers: list[str]
    rows: list[list[str]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def ms(seconds: float) -> str:
    return f"{seconds * 1e3:.3f}"


def ratio(a: float, b: float) -> str:
    return f"{a / b:.2f}x"


def timing_row(label: list[str], t: dict, base: dict | None = None) -> list[str]:
    """label cells + min ms + median ms + (median of base / median of this) when base is given."""
    row = [*label, ms(t["min"]), ms(t["median"])]
    if base is not None:
        row.append(ratio(base["median"], t["median"]))
    return row


def matmul_peak(n: int = 1024, repeats: int = 5) -> float:
    """Measured float32 FLOP/s of a square matmul (2 n^3 FLOPs), the best of `repeats`."""
    from llamablock.util.timing import time_calls

    a, b = torch.randn(n, n), torch.randn(n, n)
    t = time_calls({"mm": lambda: a @ b}, repeats=repeats, warmup=2)["mm"]["min"]
    return 2 * n**3 / t


def verdict(what: str, got: float, target: float, higher_is_better: bool = True, unit: str = "x") -> str:
    """'Target ...: met' or 'missed by N%', computed from this run's numbers."""
    ok = got >= target if higher_is_better else got <= target
    sign = ">=" if higher_is_better else "<="
    if ok:
        return f"Target {what} {sign} {target:g}{unit}: met ({got:.2f}{unit})."
    if higher_is_better:
        return f"Target {what} {sign} {target:g}{unit}: MISSED ({got:.2f}{unit}, {100 * (1 - got / target):.0f}% below it)."
    return f"Target {what} {sign} {target:g}{unit}: MISSED ({got:.2f}{unit}, {100 * (got / target - 1):.0f}% above it)."


def run_child(code: str, *args: str, env: dict | None = None):
    """Run `code` in a fresh Python process (`python -c code args...`) and return the JSON value it
    prints on its last line of stdout. Benchmarks measure in a child what one process cannot show
    twice: a cold start, allocator settings, a process with nothing else loaded. A failed child
    raises with the end of its stderr."""
    out = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, env=env)
    if out.returncode != 0:
        raise RuntimeError(f"benchmark child process failed (exit status {out.returncode}): {out.stderr.strip()[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def llama_cpp_tool(name: str) -> str | None:
    """The path of llama.cpp's tool `name` (llama-bench, llama-perplexity) built by hand: in the folder
    $LLAMA_CPP_BIN names, else on the PATH; None where neither has it (the project never installs it)."""
    folder = os.environ.get("LLAMA_CPP_BIN")
    found = Path(folder) / name if folder else None
    return str(found) if found and found.exists() else shutil.which(name)

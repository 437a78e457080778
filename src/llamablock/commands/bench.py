"""`llamablock bench [--quick] [--output PATH] [--into PATH] [--threads N] [NAME ...]`: the benchmarks.

The benchmarks are the repository's top-level `benchmarks/` package (one module each, timing
competing implementations interleaved in one process), beside `src/`, not part of the installed
library. This command runs them as `python -m benchmarks` in a child process from a source
checkout, so the package never imports them. A full run writes BENCHMARKS.md at the repository
root (atomically); --quick runs tiny sizes for CI and writes only where --output says; --into
BENCHMARKS.md puts the named benchmarks' sections into it, leaving the others.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def add_arguments(p) -> None:
    p.add_argument("names", nargs="*", metavar="NAME",
                   help="benchmarks to run (default: all; benchmarks/runner.py's BENCHMARKS names them, and an "
                        "unknown name is answered with the list)")
    p.add_argument("--quick", action="store_true", help="tiny sizes and few repeats (seconds; for CI), no file written")
    p.add_argument("--output", type=Path, default=None,
                   help="where to write the markdown report (default: BENCHMARKS.md at the repository root "
                        "for a full run of all benchmarks, nowhere otherwise)")
    p.add_argument("--into", type=Path, default=None, metavar="PATH",
                   help="put the named benchmarks' sections into this existing report (BENCHMARKS.md) in place of "
                        "their old ones, or at its end, each under this run's header; the rest of it stays as it is")


def repository() -> Path:
    """The source checkout this package is installed from (pip install -e .), which holds benchmarks/."""
    root = Path(__file__).resolve().parents[3]
    if not (root / "benchmarks" / "runner.py").is_file():
        raise FileNotFoundError(f"the benchmarks/ folder is not next to the package (looked in {root}); "
                                "run `llamablock bench` from a source checkout (pip install -e .)")
    return root


def run(args) -> int:
    argv = [*args.names, *(["--quick"] if args.quick else [])]
    if args.output is not None:
        argv += ["--output", str(args.output.absolute())]
    if args.into is not None:
        argv += ["--into", str(args.into.absolute())]
    argv += ["--threads", str(args.threads)]  # the command line's --threads (llamablock.cli)
    sys.stdout.flush()
    return subprocess.call([sys.executable, "-m", "benchmarks", *argv], cwd=repository())

"""`llamablock bench [--quick] [--output PATH] [NAME ...]`: the speed benchmarks (issue 8).

The benchmarks live in the repository's top-level `benchmarks/` package (one module each,
timing competing implementations interleaved in one process), next to `src/`; this command
finds it from the editable install. A full run writes BENCHMARKS.md at the repository root
(atomically); --quick runs tiny sizes for CI and writes only where --output says.
"""

from __future__ import annotations

import sys
from pathlib import Path


def _import_runner():
    root = Path(__file__).resolve().parents[3]
    if not (root / "benchmarks" / "runner.py").is_file():
        raise FileNotFoundError(f"the benchmarks/ folder is not next to the package (looked in {root}); "
                                "run `llamablock bench` from a source checkout (pip install -e .)")
    if str(root) not in sys.path:
        sys.path.insert(0, str(root))
    from benchmarks import runner

    return runner, root


def add_arguments(p) -> None:
    p.add_argument("names", nargs="*", metavar="NAME",
                   help="benchmarks to run (default: all; benchmarks/runner.py's BENCHMARKS names them, and an "
                        "unknown name is answered with the list)")
    p.add_argument("--quick", action="store_true", help="tiny sizes and few repeats (seconds; for CI), no file written")
    p.add_argument("--output", type=Path, default=None,
                   help="where to write the markdown report (default: BENCHMARKS.md at the repository root "
                        "for a full run of all benchmarks, nowhere otherwise)")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")


def run(args) -> int:
    runner, root = _import_runner()
    names = runner.check_names(list(args.names))
    if args.threads is not None:
        if args.threads < 1:
            raise ValueError(f"--threads must be at least 1, got {args.threads}")
        import torch

        torch.set_num_threads(args.threads)
    output = args.output
    if output is None and not args.quick and not args.names:
        output = root / "BENCHMARKS.md"
    runner.run_benchmarks(names, quick=args.quick, output=output)
    if output is not None:
        print(f"wrote {output}")
    return 0

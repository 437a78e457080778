"""`llamablock lab`: measure every claim of the module and write an honest report."""

from __future__ import annotations

from pathlib import Path


def add_arguments(p) -> None:
    p.add_argument("--quick", action="store_true",
                   help="reduced repeats, sizes and seeds (training claims marked indicative); the full lab trains "
                        "every claim's models at full size and with three seeds")
    p.add_argument("--only", nargs="+", metavar="SECTION_OR_ID",
                   help="run only these sections (15.1 ... 15.6, exercises) or the claims whose id starts with these")
    p.add_argument("--out", default="lab-out", help="directory for report.md, results.json and plots (default: %(default)s)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")


def run(args) -> int:
    from llamablock.lab.runner import parse_only, run_lab, table

    parse_only(args.only)  # a bad --only fails before anything runs
    print(f"llamablock lab{' --quick' if args.quick else ''}: writing to {args.out}/ "
          f"({'reduced sizes' if args.quick else 'full sizes: the training claims take the longest'})")
    claims = run_lab(Path(args.out), quick=args.quick, only=args.only, progress=not args.no_progress)
    print(table(claims))
    print(f"\nreport: {Path(args.out) / 'report.md'}   results: {Path(args.out) / 'results.json'}")
    return 0

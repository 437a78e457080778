"""`llamablock compare`: the 2017 block, the 2024 block and the four single changes, trained alike."""

from __future__ import annotations

import json
import time
from pathlib import Path

from llamablock.util.files import atomic_write


def add_arguments(p) -> None:
    p.add_argument("--steps", type=int, default=200, help="optimizer steps per run (default %(default)s)")
    p.add_argument("--seeds", type=int, default=3, help="seeds per variant, 0..N-1 (default %(default)s)")
    p.add_argument("--d-model", type=int, default=128, help="model width (default %(default)s)")
    p.add_argument("--layers", type=int, default=4, help="blocks (default %(default)s)")
    p.add_argument("--heads", type=int, default=4, help="query heads, even (default %(default)s)")
    p.add_argument("--context", type=int, default=128, help="tokens per window (default %(default)s)")
    p.add_argument("--batch-size", type=int, default=16, help="windows per step (default %(default)s)")
    p.add_argument("--lr", type=float, default=1e-3, help="peak learning rate, all variants (default %(default)s)")
    p.add_argument("--warmup", type=int, help="warm-up steps (default: 40%% of --steps; post-LN needs a long one)")
    p.add_argument("--only", action="append", metavar="VARIANT", help="run only this variant (repeatable)")
    p.add_argument("--out", default="compare-out", help="folder for compare.json and compare.png (default %(default)s)")


def run(args) -> int:
    from llamablock.studies.ablation import (
        format_table,
        plot_compare,
        run_compare,
        summarize,
    )

    if args.seeds <= 0 or args.steps <= 0:
        raise ValueError("--seeds and --steps must be positive")
    start = time.perf_counter()
    records = run_compare(args.steps, tuple(range(args.seeds)), dict(d_model=args.d_model, n_layers=args.layers,
                          n_heads=args.heads), args.context, args.batch_size, args.lr, args.warmup, args.only,
                          log=lambda line: print(line, flush=True))
    summary = summarize(records)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    atomic_write(out / "compare.json", lambda p: p.write_text(json.dumps({"summary": summary, "records": records}, indent=1)))
    plot_compare(records, summary, out / "compare.png")
    print()
    print(format_table(summary))
    print(f"\n{len(records)} runs in {time.perf_counter() - start:.0f} s; wrote {out / 'compare.json'} and "
          f"{out / 'compare.png'}")
    return 0

"""`llamablock trace`: one text through the trained 2017 and 2024 models, stage by stage (section 15.6)."""

from __future__ import annotations

import json


def add_arguments(p) -> None:
    p.add_argument("--text", required=True, help="the input text (characters of the Shakespeare corpus)")
    p.add_argument("--token", type=int, default=-1, help="which token's stream the table shows (default: the last)")
    p.add_argument("--top-k", type=int, default=5, help="next-token predictions to list (default %(default)s)")
    p.add_argument("--cache-dir", help="where the trained pair is cached (default ~/.cache/llamablock)")
    p.add_argument("--json", action="store_true", help="print the whole trace (every token, every stage) as JSON")
    p.add_argument("--png", help="also write a plot of RMS and variance by stage to this file")


def run(args) -> int:
    from llamablock.studies.trace import format_table, plot_pair, trace_pair

    result = trace_pair(args.text, cache_dir=args.cache_dir, top_k=args.top_k, progress=not args.json)
    n = len(result["models"]["2017"]["tokens"])
    if not -n <= args.token < n:
        raise ValueError(f"--token {args.token} is outside the text's {n} tokens")
    print(json.dumps(result, indent=1) if args.json else format_table(result, args.token))
    if args.png:
        plot_pair(result, args.png, args.token)
    return 0

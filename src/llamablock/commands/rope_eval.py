"""`llamablock rope eval`: every context-extension method run past a checkpoint's trained context,
loss by position against the model in its own sliding window (section 15.2, measured).

Thin: the methods and losses are llamablock.studies.context_extension's, the bins and intervals
studies.position_stats', the cache studies.loss_cache's. Registered as an action of `rope`.
"""

from __future__ import annotations

import json
import math
import time

from llamablock.commands import UsageError

ALL = ("none", "linear", "ntk", "dynamic", "dynamic-consistent", "yarn", "yarn-no-factor", "llama3", "self-extend",
       "sinks")
MAX_TEXT = 16 << 20  # bytes read from one --text file


def add_arguments(p) -> None:
    p.add_argument("--model", default=None, metavar="PATH|NAME",
                   help="a .gguf file, a transformers directory or an embedded model name (default: smollm2-135m-instruct)")
    p.add_argument("--text", action="append", metavar="FILE", help="a UTF-8 text file, one document; repeatable "
                   "(default: the longest packaged Shakespeare plays with at least --tokens tokens)")
    p.add_argument("--docs", type=int, default=3, help="how many plays when no --text is given (default %(default)s)")
    p.add_argument("--tokens", type=int, default=None, metavar="N",
                   help="tokens of each document evaluated as one sequence (default: 2 x the trained context L)")
    p.add_argument("--methods", default=",".join(ALL), help=f"comma-separated, of {', '.join(ALL)} (default: all)")
    p.add_argument("--factor", type=float, default=None, help="extension factor s (default: N / L, at least 1)")
    p.add_argument("--bin", type=int, default=1024, help="positions per bin (default %(default)s)")
    p.add_argument("--stride", type=int, default=None, help="the reference window's stride (default: L / 4)")
    p.add_argument("--grp-attn-n", type=int, default=None, metavar="G", help="self-extend's group size, as llama.cpp's "
                   "(default: the smallest that keeps every grouped distance inside L)")
    p.add_argument("--grp-attn-w", type=int, default=None, metavar="W",
                   help="self-extend's neighbour window, as llama.cpp's (default: L / 4)")
    p.add_argument("--cache-dir", default=None, metavar="DIR",
                   help="where per-token losses are kept between runs (default: ~/.cache/llamablock/rope-eval)")
    p.add_argument("--no-cache", action="store_true", help="compute everything, keep nothing")
    p.add_argument("--task", choices=("loss", "passkey"), default="loss",
                   help="loss: per-token loss by position; passkey: find a five-digit key hidden at 10/50/90%% depth, "
                        "at lengths L/2, L (the control) and N (default %(default)s)")
    p.add_argument("--trials", type=int, default=2, help="passkey: keys per depth and length (default %(default)s)")
    p.add_argument("--json", action="store_true", dest="eval_json", help="print the result as one JSON object")
    p.add_argument("--plot", metavar="FILE.png", dest="eval_plot", help="loss by position, one line per method (matplotlib)")


def _methods(text: str) -> list[str]:
    methods = [m.strip() for m in text.split(",") if m.strip()]
    bad = [m for m in methods if m not in ALL]
    if bad or not methods:
        raise UsageError(f"--methods: unknown {', '.join(bad) or '(none given)'}; choose from {', '.join(ALL)}")
    return list(dict.fromkeys(methods))


def _documents(args, tok, tokens: int) -> list[tuple[str, list[int]]]:
    from llamablock.studies.context_extension import shakespeare_documents
    from llamablock.util.reads import read_text_bounded, regular_file

    if not args.text:
        if args.docs < 1:
            raise UsageError(f"--docs must be at least 1, got {args.docs}")
        return shakespeare_documents(tok, tokens, args.docs)
    docs = []
    for f in args.text:
        ids = tok.encode(read_text_bounded(regular_file(f, "--text file"), MAX_TEXT, "--text file"))
        if len(ids) < tokens:
            raise UsageError(f"--text {f} has {len(ids):,} tokens, fewer than --tokens {tokens:,}; give a longer "
                             "document or a smaller --tokens")
        docs.append((f, ids))
    return docs


def run(args) -> int:
    import torch

    from llamablock.io.loading import load_decoder
    from llamablock.io.source import open_source
    from llamablock.studies.context_extension import evaluate_methods, trained_context
    from llamablock.studies.grouped_attention import SelfExtend
    from llamablock.studies.loss_cache import (
        LossCache,
        default_cache_dir,
        model_identity,
    )
    from llamablock.studies.position_stats import summarize

    methods = _methods(args.methods)
    for flag, v in (("--tokens", args.tokens), ("--bin", args.bin), ("--stride", args.stride),
                    ("--grp-attn-n", args.grp_attn_n), ("--grp-attn-w", args.grp_attn_w)):
        if v is not None and v < (2 if flag == "--tokens" else 1):
            raise UsageError(f"{flag} must be at least {2 if flag == '--tokens' else 1}, got {v}")
    if args.factor is not None and not (math.isfinite(args.factor) and args.factor >= 1):
        raise UsageError(f"--factor must be a number >= 1 (it extends the context), got {args.factor}")
    source = open_source(args.model)  # resolved and read once (io/source.py)
    model, tok = load_decoder(source, torch.float32), source.tokenizer
    if model.cfg.position != "rope":
        raise UsageError(f"rope eval needs a RoPE model; {args.model or 'the model'} uses position={model.cfg.position!r}")
    L = trained_context(model)
    tokens = args.tokens or 2 * L
    factor = args.factor or max(1.0, tokens / L)
    stride = args.stride or max(1, L // 4)
    if stride > L:
        raise UsageError(f"--stride must be at most the trained context {L}, got {stride}")
    self_extend = None
    if args.grp_attn_n or args.grp_attn_w:
        from llamablock.studies.context_extension import default_self_extend

        d = default_self_extend(tokens, L)
        self_extend = SelfExtend(group=args.grp_attn_n or d.group, window=args.grp_attn_w or d.window)
    if args.task == "passkey":
        return _passkey(args, source, model, methods, tokens, factor)
    docs = _documents(args, tok, tokens)
    cache = LossCache(None if args.no_cache else (args.cache_dir or default_cache_dir()))
    started = time.perf_counter()
    losses = evaluate_methods(model, docs, methods, tokens, factor, stride, cache,
                              model_identity(source.path), self_extend=self_extend,
                              progress=not args.eval_json)
    result = {"model": str(source.path), "trained_context": L, "tokens": tokens, "factor": factor,
              "stride": stride, "documents": [name for name, _ in docs],
              "methods": summarize(losses, L, args.bin), "cache": {"hits": cache.hits, "computed": cache.misses},
              "seconds": round(time.perf_counter() - started, 1)}
    if args.eval_plot:
        from llamablock.studies.context_extension_plot import plot_losses

        plot_losses(result, args.eval_plot)
    print(json.dumps(result) if args.eval_json else _text(result))
    if args.eval_plot and not args.eval_json:
        print(f"plot written to {args.eval_plot}")
    return 0


def _text(r: dict) -> str:
    ms = r["methods"]
    names = list(dict.fromkeys(name for m in ms.values() for name in m["perplexity"]))
    lines = [f"{r['model']}: trained context L = {r['trained_context']:,}, {r['tokens']:,} tokens x "
             f"{len(r['documents'])} documents, factor {r['factor']:g}, reference stride {r['stride']}",
             "perplexity by range (tokens of context seen); delta = mean nats per token against the reference, "
             "[95% interval across documents]", ""]
    lines.append(f"{'method':<19}" + "".join(f"{n:>30}" for n in names))
    for method, m in ms.items():
        cells = ""
        for n in names:
            d = m.get("delta", {}).get(n)
            ci = "" if d is None else (f" {d['mean']:+.3f}" + (f" [{d['low']:+.3f},{d['high']:+.3f}]"
                                                                if d["low"] is not None else ""))
            cells += f"{m['perplexity'][n]:>9.3f}{ci:>21}"
        lines.append(f"{method:<19}" + cells)
    lines += ["", f"cache: {r['cache']['hits']} passes read, {r['cache']['computed']} computed in {r['seconds']:,.0f} s"]
    return "\n".join(lines)


def _passkey(args, source, model, methods: list[str], tokens: int, factor: float) -> int:
    from llamablock.studies.passkey import run_passkey

    if args.trials < 1:
        raise UsageError(f"--trials must be at least 1, got {args.trials}")
    L = model.cfg.max_seq_len
    lengths = sorted({L // 2, L, tokens})
    r = run_passkey(model, source.tokenizer, methods, lengths, factor, args.trials, progress=not args.eval_json)
    r = {"task": "passkey", "model": str(source.path), "trained_context": L, "tokens": tokens,
         "factor": factor, **r}
    if args.eval_json:
        print(json.dumps(r))
        return 0
    print(f"{r['model']}: passkey accuracy, {len(r['depths'])} depths x {r['trials']} keys per length "
          f"(L = {L:,}, factor {factor:g})")
    print(f"{'method':<19}" + "".join(f"{n:>10,}" for n in lengths))
    for m, acc in r["methods"].items():
        print(f"{m:<19}" + "".join(f"{acc[str(n)]:>10.2f}" for n in lengths))
    print(r["verdict"])
    return 0

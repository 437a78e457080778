"""The flags that let `generate` (and `generate --chat`) run past the context, with llama.cpp's names
where it has them, and the engine they make (runtime/overflow.py, studies/grouped_cache.py).

    --context-overflow stop|shift|sinks   what happens when the sequence fills --ctx-size
    --keep N                              shift: the first N tokens always kept (llama.cpp's --keep)
    --grp-attn-n G --grp-attn-w W         Self-Extend (llama.cpp's): distances past W shrink G
                                          times, so --ctx-size may reach about G times the
                                          trained context without --rope-scaling

Each mistake is one ValueError line (exit status 2): a flag without the mode it belongs to, two
modes at once, numbers out of range, a --ctx-size Self-Extend cannot reach, and the compiled
engine (these run eagerly: their attention is not the compiled step's).
"""

from __future__ import annotations

import argparse
import dataclasses

from llamablock.runtime.overflow import POLICIES, SINK_TOKENS, ShiftEngine

GRP_ATTN_W = 512  # llama.cpp's default --grp-attn-w


def add_overflow_arguments(p) -> None:
    g = p.add_argument_group("past the context")
    g.add_argument("--context-overflow", choices=POLICIES, default="stop",
                   help="when the sequence fills --ctx-size: stop (refuse a longer request up front), shift "
                        "(llama.cpp's context shift: keep --keep first tokens, drop the oldest half of the rest, "
                        f"recompute the kept ones), sinks (StreamingLLM: the first {SINK_TOKENS} tokens and the most "
                        "recent ones); default: stop")
    g.add_argument("--keep", type=int, default=None, metavar="N",
                   help="with --context-overflow shift: the first N tokens always kept (default 0)")
    g.add_argument("--grp-attn-n", type=int, default=None, metavar="G",
                   help="Self-Extend: group distances past --grp-attn-w by G, so --ctx-size may exceed the trained "
                        "context about G times without --rope-scaling (llama.cpp's flag)")
    g.add_argument("--grp-attn-w", type=int, default=None, metavar="W",
                   help=f"Self-Extend's neighbour window, a multiple of G (default {GRP_ATTN_W}, as llama.cpp)")


def check_overflow_flags(args) -> None:
    """The refusals that need no model."""
    policy, g, w = args.context_overflow, args.grp_attn_n, args.grp_attn_w
    if args.keep is not None and policy != "shift":
        raise ValueError(f"--keep applies to --context-overflow shift, not {policy}")
    if w is not None and g is None:
        raise ValueError("--grp-attn-w applies to Self-Extend: give --grp-attn-n too")
    if g is None:
        if policy == "sinks" and args.rope_scaling not in (None, "none"):
            raise ValueError("--context-overflow sinks runs plain RoPE: drop --rope-scaling")
        return
    if g < 1 or (w is not None and w < 1):
        raise ValueError(f"--grp-attn-n and --grp-attn-w must be positive, got {g} and {w}")
    if (w or GRP_ATTN_W) % g:
        raise ValueError(f"--grp-attn-w ({w or GRP_ATTN_W}) must be a multiple of --grp-attn-n ({g}), as llama.cpp asks")
    if policy != "stop":
        raise ValueError(f"choose one of Self-Extend (--grp-attn-n) and --context-overflow {policy}")
    if args.rope_scaling not in (None, "none"):
        raise ValueError("Self-Extend (--grp-attn-n) extends plain RoPE: drop --rope-scaling")


def eager_only(args) -> bool:
    """Whether these flags need the eager Decoder (sinks and Self-Extend attend their own way)."""
    return args.grp_attn_n is not None or args.context_overflow == "sinks"


def self_extend_source(source, args, scaled_source):
    """`source` sized for Self-Extend: `scaled_source` (io/scaling_flags.py) without --ctx-size, then the
    context raised to --ctx-size, after checking that Self-Extend reaches it: the farthest query's
    grouped position, P_q(N - 1) = (N - 1) // G + W - W // G, must lie inside the trained context."""
    source = scaled_source(source, argparse.Namespace(**{**vars(args), "ctx_size": None}))
    n, trained = args.ctx_size or source.cfg.max_seq_len, source.cfg.max_seq_len
    g, w = args.grp_attn_n, args.grp_attn_w or GRP_ATTN_W
    if w >= trained:
        raise ValueError(f"--grp-attn-w {w} must be below the trained context of {trained} tokens")
    reach = (trained - w + w // g) * g  # the first N whose last query falls outside
    if n > reach:
        raise ValueError(f"Self-Extend with --grp-attn-n {g} --grp-attn-w {w} reaches {reach} tokens of a model "
                         f"trained on {trained}; give --ctx-size {reach} or less, or a larger --grp-attn-n")
    return dataclasses.replace(source, cfg=source.cfg.replace(max_seq_len=n)) if n != trained else source


def overflow_engine(args, engine, model):
    """`engine` as the flags run it: wrapped for shift, or the grouped engine over `model` (the
    eager Decoder) for sinks and Self-Extend; `engine` itself for stop."""
    from llamablock.studies.grouped_attention import SelfExtend, Sinks
    from llamablock.studies.grouped_cache import GroupedEngine

    ctx = engine.cfg.max_seq_len
    if args.grp_attn_n is not None:
        return GroupedEngine(model, SelfExtend(args.grp_attn_n, args.grp_attn_w or GRP_ATTN_W), engine.describe())
    if args.context_overflow == "sinks":
        if ctx <= SINK_TOKENS:
            raise ValueError(f"--context-overflow sinks needs a --ctx-size above its {SINK_TOKENS} sink tokens")
        return GroupedEngine(model, Sinks(SINK_TOKENS, ctx - SINK_TOKENS), engine.describe())
    if args.context_overflow == "shift":
        return ShiftEngine(engine, ctx, args.keep or 0)
    return engine

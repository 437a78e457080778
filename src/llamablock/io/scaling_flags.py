"""The context and RoPE-scaling flags of the commands that run a model (`generate`, `perplexity`,
`serve`) and of `export`, named as llama.cpp names them, and the model source they make.

    --ctx-size N             tokens the run allows (default: the model's context, cfg.max_seq_len)
    --rope-scaling METHOD    none, linear, ntk, dynamic, yarn or llama3 (rope_scaling.py's types)
    --rope-scale S           the factor (default: N / the original context)
    --yarn-orig-ctx L        the original context yarn and llama3 extend from
    --yarn-beta-fast/-slow   yarn's ramp between kept and interpolated pairs
    --yarn-attn-factor F     multiplies yarn's cos/sin scale 0.1 ln S + 1, as llama.cpp's does
    --rope-freq-base THETA   RoPE's base, replacing rope_theta

A command reads its model once (io/source.py open_source), then `scaled_source(source, args)`
(`scaled_config` on a config alone; `export_config` for an export, which declares a context
rather than runs one) turns the flags into transformers' `rope_scaling` dict and a new config,
`cfg.replace(rope_scaling=..., max_seq_len=N)`: the run is the model whose config.json said so,
and everything below it (the plan, the loader, the context checks of generation, perplexity and
the server) reads that config and nothing else. The config checks the dict
(rope_scaling.validate_rope_scaling, whose messages name the field); here the flag is named too.
A model whose config already scales RoPE keeps its scaling unless --rope-scaling replaces it.

Dynamic NTK's dict names its original length (`original_max_position_embeddings`, which
rope_scaling.py reads as L), since --ctx-size raises max_seq_len. `dynamic` is transformers' cached
generation, `dynamic-consistent` re-rotates the cached keys (rope_scaling.rotates_cached_keys).
"""

from __future__ import annotations

import argparse
import dataclasses
import math

from llamablock.rope_scaling import yarn_attention_factor

METHODS = ("none", "linear", "ntk", "dynamic", "dynamic-consistent", "yarn", "llama3")
EXTENDS = "linear|ntk|dynamic|dynamic-consistent|yarn|llama3"
LLAMA3_BAND = {"low_freq_factor": 1.0, "high_freq_factor": 4.0}  # Llama 3.1's config.json values
# a rope_scaling field -> the flag that sets it, so that the config's refusal names the flag
FLAG_OF = {"factor": "--rope-scale", "original_max_position_embeddings": "--yarn-orig-ctx",
           "beta_fast": "--yarn-beta-fast", "beta_slow": "--yarn-beta-slow", "attention_factor": "--yarn-attn-factor"}
NEEDS = {"rope_scale": ("--rope-scale", EXTENDS), "yarn_orig_ctx": ("--yarn-orig-ctx", "yarn|llama3"),
         "yarn_beta_fast": ("--yarn-beta-fast", "yarn"), "yarn_beta_slow": ("--yarn-beta-slow", "yarn"),
         "yarn_attn_factor": ("--yarn-attn-factor", "yarn")}


def add_scaling_arguments(p) -> None:
    """The flags above, as one group of `p`'s arguments."""
    g = p.add_argument_group("context and RoPE scaling (llama.cpp's flag names)")
    g.add_argument("--ctx-size", type=int, default=None, metavar="N",
                   help="tokens the run allows, prompt and new tokens (default: the model's trained context); "
                        f"above it, give --rope-scaling {EXTENDS}")
    g.add_argument("--rope-scaling", default=None, metavar="{" + ",".join(METHODS) + "}",
                   help="how RoPE reaches past the trained context: linear (position interpolation), ntk (static "
                        "NTK-aware base), yarn, llama3 (Llama 3.1's), dynamic (NTK grown with the length, keys cached "
                        "as rotated: transformers'), dynamic-consistent (the same, cached keys rotated again at "
                        "each step), none (plain RoPE, dropping the model's own scaling); default: the "
                        "model's own scaling, where its config has one")
    g.add_argument("--rope-scale", type=float, default=None, metavar="S",
                   help="the scaling factor, at least 1 (default: --ctx-size / the original context)")
    g.add_argument("--yarn-orig-ctx", type=int, default=None, metavar="N",
                   help="yarn and llama3: the context the model was trained on (default: the original context "
                        "its own scaling names, else its context)")
    g.add_argument("--yarn-beta-fast", type=float, default=None, metavar="B",
                   help="yarn: pairs turning more than B times in the original context keep their frequency "
                        "(default: 32)")
    g.add_argument("--yarn-beta-slow", type=float, default=None, metavar="B",
                   help="yarn: pairs turning fewer than B times there are interpolated by the whole factor "
                        "(default: 1)")
    g.add_argument("--yarn-attn-factor", type=float, default=None, metavar="F",
                   help="yarn: multiplies its cos/sin scale 0.1 ln S + 1, as llama.cpp's (default: 1)")
    g.add_argument("--rope-freq-base", type=float, default=None, metavar="THETA",
                   help="RoPE's base, replacing the model's rope_theta (default: the model's)")


def check_flags(args) -> None:
    """The refusals that need no model: an unknown method, a flag that needs a method it lacks, a
    number out of its range (ValueError, one line: the command line exits with status 2)."""
    method = args.rope_scaling
    if method is not None and method not in METHODS:
        raise ValueError(f"--rope-scaling {method!r} is unknown; choose one of {', '.join(METHODS)}")
    for dest, (flag, methods) in NEEDS.items():
        if getattr(args, dest) is not None and method not in methods.split("|"):
            said = f"not with --rope-scaling {method}" if method else "and none is given"
            raise ValueError(f"{flag} applies to --rope-scaling {methods}, {said}")
    if args.ctx_size is not None and args.ctx_size < 2:
        raise ValueError(f"--ctx-size must be at least 2 tokens, got {args.ctx_size}")
    if args.rope_scale is not None and not (math.isfinite(args.rope_scale) and args.rope_scale >= 1):
        raise ValueError(f"--rope-scale must be at least 1, got {args.rope_scale}: a factor below 1 would shrink "
                         "the context, not extend it")
    if args.yarn_orig_ctx is not None and args.yarn_orig_ctx < 1:
        raise ValueError(f"--yarn-orig-ctx must be a positive number of tokens, got {args.yarn_orig_ctx}")
    for flag, v in (("--yarn-attn-factor", args.yarn_attn_factor), ("--rope-freq-base", args.rope_freq_base)):
        if v is not None and not (math.isfinite(v) and v > 0):
            raise ValueError(f"{flag} must be a positive number, got {v}")


def original_context(cfg) -> int:
    """The context the model's scaling extends from: its own scaling's original length, else its context."""
    return (cfg.rope_scaling or {}).get("original_max_position_embeddings") or cfg.max_seq_len


def scaling_dict(cfg, method: str, n: int, args) -> dict:
    """transformers' `rope_scaling` dict for `method` at a context of `n` tokens, from the flags."""
    original = args.yarn_orig_ctx or original_context(cfg)
    factor = args.rope_scale if args.rope_scale is not None else n / original
    if factor < 1:
        raise ValueError(f"--rope-scaling {method} at --ctx-size {n} from an original context of {original} tokens "
                         f"would be a factor of {factor:g}, below 1; give a --ctx-size of at least {original}")
    d = {"rope_type": method, "factor": float(factor)}
    if method in ("yarn", "llama3", "dynamic", "dynamic-consistent"):
        d["original_max_position_embeddings"] = original
    if method == "llama3":
        d.update(LLAMA3_BAND)
    if method == "yarn":
        d.update({k: v for k, v in (("beta_fast", args.yarn_beta_fast), ("beta_slow", args.yarn_beta_slow))
                  if v is not None})
        if args.yarn_attn_factor is not None:  # llama.cpp's multiplier of the scale, not a replacement
            d["attention_factor"] = args.yarn_attn_factor * yarn_attention_factor({}, factor)
    return d


def scaled_config(cfg, args, window: int | None = None):
    """`cfg` as the flags in `args` change it (`cfg` itself when they change nothing). `window`:
    tokens one forward pass needs (perplexity's --context): without --ctx-size it is the context,
    when longer than the model's."""
    check_flags(args)
    method = args.rope_scaling
    trained = cfg.max_seq_len
    n = args.ctx_size if args.ctx_size is not None else max(trained, window or 0)
    extends = method not in (None, "none")
    if n > trained and not extends:
        said = f"--ctx-size {n}" if args.ctx_size is not None else f"--context {window}"
        raise ValueError(f"{said} exceeds the model's trained context of {trained} tokens; extend it with "
                         f"--rope-scaling {EXTENDS}")
    changes = {"max_seq_len": n} if n != trained else {}
    if method == "none":
        changes["rope_scaling"] = None
    elif extends:
        changes["rope_scaling"] = scaling_dict(cfg, method, n, args)
    elif n != trained and (cfg.rope_scaling or {}).get("rope_type", "").startswith("dynamic"):
        # its own dynamic NTK keeps growing from the trained context, not from --ctx-size
        changes["rope_scaling"] = {"original_max_position_embeddings": trained, **cfg.rope_scaling}
    if args.rope_freq_base is not None:
        changes["rope_theta"] = float(args.rope_freq_base)
    if not changes:
        return cfg
    try:
        return cfg.replace(**changes)
    except ValueError as e:
        message = str(e)
        for field, flag in FLAG_OF.items():
            message = message.replace(f"rope_scaling.{field}", flag).replace(f" {field} (", f" {flag} (")
        raise ValueError(message) from None


def scaled_source(source, args, window: int | None = None):
    """`source` (an io/source.py ModelSource) with the config the flags in `args` say (`source` itself
    when they change nothing). ModelSource is not imported: io/export.py reads this module, and the
    import chain through it would pass tests/test_layers.py's bound."""
    new = scaled_config(source.cfg, args, window)
    if new.max_seq_len > source.cfg.max_seq_len:
        check_cache_fits(new)
    return source if new == source.cfg else dataclasses.replace(source, cfg=new)


def check_cache_fits(cfg) -> None:
    """Refuse a context whose KV cache, even in 16 bits (the smallest any engine keeps), is more than
    the machine's available memory: one line with the calculator's size (kv_cache.cache_bytes, the
    total of diagnostics/kv_calculator.py), before the run sizes RoPE tables and caches for it and
    fails deep inside, or swaps."""
    from llamablock.kv_cache import cache_bytes
    from llamablock.util.units import available_memory, human_bytes

    need, free = cache_bytes(cfg, cfg.max_seq_len, value_bytes=2), available_memory()
    if free is not None and need > free:
        raise ValueError(f"--ctx-size {cfg.max_seq_len} needs a KV cache of {human_bytes(need)} in 16 bits "
                         f"(diagnostics/kv_calculator.py) and this machine has {human_bytes(free)} available; "
                         "choose a smaller --ctx-size")


def export_config(cfg, args):
    """The config an export declares (`llamablock export`): scaled_config's, except that a method
    without --ctx-size declares the context its factor reaches (original context x --rope-scale),
    since an export has no prompt to size it, and a method with neither is refused (its factor
    would be 1). A model with other positions than RoPE takes none of these flags."""
    check_flags(args)
    given = [f"--{d.replace('_', '-')}" for d in ("ctx_size", "rope_scaling", "rope_freq_base", *NEEDS)
             if getattr(args, d) is not None]
    if given and cfg.position != "rope":
        raise ValueError(f"{given[0]} applies to a model with RoPE positions; this one has {cfg.position} positions")
    method = args.rope_scaling
    if method not in (None, "none") and args.ctx_size is None:
        if args.rope_scale is None:
            raise ValueError(f"--rope-scaling {method} needs --rope-scale S or --ctx-size N: the export declares the "
                             "context the model is extended to")
        reach = round((args.yarn_orig_ctx or original_context(cfg)) * args.rope_scale)
        args = argparse.Namespace(**{**vars(args), "ctx_size": max(reach, 2)})
    return scaled_config(cfg, args)

"""`llamablock rope`: what each context-extension method does to each rotary pair (section 15.2),
and `llamablock rope lint config.json|file.gguf`: RoPE settings that load but do not do what they say.

Thin: the numbers come from llamablock.diagnostics.rope_table (which also reads the config), the
warnings from llamablock.diagnostics.rope_lint.
"""

from __future__ import annotations

import json
import math
import os

from llamablock.commands import UsageError, rope_eval
from llamablock.diagnostics.rope_plot import plot_wavelengths
from llamablock.diagnostics.rope_table import (
    DEFAULT_TARGET,
    DEFAULT_TRAIN,
    RopeConfig,
    pair_table,
    read_rope_config,
)
from llamablock.presets import PRESETS
from llamablock.util.reads import MAX_JSON, regular_file


def add_arguments(p) -> None:
    p.add_argument("--config", help="a preset name or a config.json (transformers or llamablock); gives head width, "
                   "base, partial rotary and the config's own scaling (default: none, use the flags below)")
    p.add_argument("--train-len", type=int, help="training length L in tokens (default: the config's original length "
                   f"if it scales, else its max_seq_len; {DEFAULT_TRAIN} without a config)")
    p.add_argument("--target-len", type=int, help="target length T in tokens (default: the config's max_seq_len if "
                   f"it scales, else 8 x L; {DEFAULT_TARGET} without a config)")
    p.add_argument("--head-dim", type=int, help="head width d (default: the config's, else 128)")
    p.add_argument("--base", type=float, help="RoPE base theta (default: the config's rope_theta, else 10000)")
    p.add_argument("--json", action="store_true", help="print the per-pair records of every method as JSON")
    p.add_argument("--plot", metavar="FILE.png", help="draw wavelength per pair for each method (matplotlib) to FILE.png")
    sub = p.add_subparsers(dest="action", metavar="ACTION")
    what = "warn on RoPE traps in a transformers config.json or a GGUF file (exit status 1 if any)"
    lint = sub.add_parser("lint", help=what, description=what)
    lint.add_argument("config_json", metavar="config.json|file.gguf",
                      help="the transformers config.json or .gguf file to check (a .gguf by its suffix)")
    lint.add_argument("--json", action="store_true", dest="lint_json", help="print the warnings as a JSON list")
    what = ("check that a checkpoint's W_q/W_k rows are in the RoPE pair layout the model rotates (the q/k layout "
            "mix-up), from its loss on Shakespeare with the rows as loaded and permuted (exit status 1 if mixed up)")
    layout = sub.add_parser("layout", help=what, description=what)
    layout.add_argument("--model", help="a .gguf file, a transformers directory or an embedded model name "
                        "(default: smollm2-135m-instruct)")
    layout.add_argument("--tokens", type=int, default=256, help="tokens of text to compare losses on (default %(default)s)")
    what = ("run every context-extension method past a checkpoint's trained context; loss by position against "
            "the model in its own sliding window")
    rope_eval.add_arguments(sub.add_parser("eval", help=what, description=what))


MAX_LEN = 1 << 30  # tokens: a thousand times the longest contexts published
MAX_HEAD_DIM = 1 << 16  # features per head: published models use 64-256
MAX_BASE = 1e18  # published rope_theta stay under 1e9; past ~1e40 the table's float arithmetic divides by zero


def _shown(v: int) -> str:
    """An integer as typed, or its digit count when it is too long to print."""
    text = str(v)
    return text if len(text) <= 20 else f"a {len(text)}-digit number"


def _check_flags(args) -> None:
    """Refuse flags the tables cannot compute with, before any work: a base of inf or 1e-300
    divided by zero, a head width of 10^8 exhausted memory, a 400-digit length overflowed a float."""
    for flag, v in (("--train-len", args.train_len), ("--target-len", args.target_len)):
        if v is not None and not 0 < v <= MAX_LEN:
            raise UsageError(f"{flag} must be a number of tokens in 1..{MAX_LEN:,}, got {_shown(v)}")
    if args.head_dim is not None and not (4 <= args.head_dim <= MAX_HEAD_DIM and args.head_dim % 2 == 0):
        raise UsageError(f"--head-dim must be an even width in 4..{MAX_HEAD_DIM:,} (RoPE turns pairs of features), "
                         f"got {_shown(args.head_dim)}")
    if args.base is not None and not (math.isfinite(args.base) and 1 < args.base <= MAX_BASE):
        raise UsageError(f"--base must be a number above 1 and at most {MAX_BASE:g} (pair i turns at base^(-2i/d): "
                         f"at 1 or below the wavelengths do not grow with i), got {args.base:g}")


def _alibi(cfg: RopeConfig) -> int:
    from llamablock.alibi import alibi_slopes

    slopes = alibi_slopes(cfg.n_heads).tolist()
    print(f"{cfg.family} config uses position={cfg.position!r}: no rotary pairs to scale.")
    if cfg.position == "alibi":
        print("ALiBi (section 15.2's non-RoPE route) adds -slope x distance to the scores, with no trained angle to "
              "run out of; per-head slopes: " + ", ".join(f"{s:.4g}" for s in slopes))
    return 0


def _text(res: dict) -> str:
    ms = res["methods"]
    lines = [f"RoPE pairs: head width {res['head_dim']} (rotary {len(ms[0]['pairs']) * 2}), base {res['base']:g}, "
             f"trained on L = {res['train_len']}, run at T = {res['target_len']} (s = "
             f"{res['target_len'] / res['train_len']:g})",
             "per method: interpolation ratio (1 = unchanged, s = fully interpolated); "
             "! = reaches angles unseen in training, ~ = an already-resolved pair crowded", ""]
    head = f"{'pair':>4} {'freq':>10} {'wavelen':>10} {'turns@L':>9} |" + "".join(f"{m['method'][:11]:>12}" for m in ms)
    lines += [head, "-" * len(head)]
    for i, p in enumerate(ms[0]["pairs"]):
        cells = ""
        for m in ms:
            q = m["pairs"][i]
            flag = "!" if q["unseen_at_target"] else "~" if q["crowded"] else " "
            cells += f"{q['interpolation_ratio']:>11.3f}{flag}"
        lines.append(f"{i:>4} {p['frequency']:>10.4g} {p['wavelength']:>10.4g} {p['rotations_in_training']:>9.4g} |"
                     + cells)
    lines.append("")
    for m in ms:
        lines.append(f"{m['label']:<24} attention x{m['attention_factor']:.4f}   unseen pairs: "
                     f"{_ranges(m['unseen_pairs'])}   crowded pairs: {_ranges(m['crowded_pairs'])}")
    return "\n".join(lines)


def _ranges(ix: list[int]) -> str:
    if not ix:
        return "none"
    out, start = [], ix[0]
    for a, b in zip(ix, ix[1:] + [None], strict=True):
        if b != a + 1:
            out.append(f"{start}" if start == a else f"{start}-{a}")
            start = b
    return ",".join(out) + f" ({len(ix)})"


def _lint(args) -> int:
    from llamablock.diagnostics.rope_lint import lint_file

    warnings = lint_file(args.config_json)
    if args.lint_json:
        print(json.dumps([{"rule": w.rule, "message": w.message} for w in warnings], indent=2))
    else:
        for w in warnings:
            print(f"{args.config_json}: {w}")
        if not warnings:
            print(f"{args.config_json}: no RoPE problems found")
    return 1 if warnings else 0


def _layout(args) -> int:
    import torch

    from llamablock.diagnostics.layout_check import check_layout
    from llamablock.io.loading import load_model_and_tokenizer
    from llamablock.training.data import corpus_text

    if args.tokens < 16:
        raise ValueError(f"--tokens must be at least 16, got {args.tokens}")
    model, tok = load_model_and_tokenizer(args.model)
    ids = tok.encode(corpus_text()[: 8 * args.tokens])[: args.tokens]  # 8 characters per token is ample
    result = check_layout(model, torch.tensor([ids]))
    print(result.message())
    return 1 if result.verdict == "mixed up" else 0


def run(args) -> int:
    if getattr(args, "action", None) == "lint":
        return _lint(args)
    if getattr(args, "action", None) == "layout":
        return _layout(args)
    if getattr(args, "action", None) == "eval":
        return rope_eval.run(args)
    _check_flags(args)
    if args.config and args.config not in PRESETS and os.path.lexists(args.config):
        regular_file(args.config, "--config file", MAX_JSON)  # a FIFO hung the read, /dev/zero exhausted memory
    cfg = read_rope_config(args.config) if args.config else None
    if cfg is not None and args.head_dim is None and cfg.head_dim > MAX_HEAD_DIM:
        raise ValueError(f"--config {args.config}: its head width {_shown(cfg.head_dim)} is past the {MAX_HEAD_DIM:,} "
                         "this table computes; check the config, or give --head-dim")
    if cfg is not None and cfg.spec is None:
        return _alibi(cfg)
    res = pair_table(cfg, args.train_len, args.target_len, args.head_dim, args.base)
    if args.plot:
        plot_wavelengths(res, args.plot)
    if args.json:
        print(json.dumps(res, indent=1))
    else:
        print(_text(res))
        if args.plot:
            print(f"\nplot written to {args.plot}")
    return 0

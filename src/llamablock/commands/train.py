"""`llamablock train`: train a preset on Shakespeare (also under `torchrun --nproc-per-node N`).

--out is a new or empty folder, or with --resume a run of ours (llamablock.training.run_dir);
--resume accepts the first run's command again (same --preset, --set and train flags, more
--steps) and refuses, by name, only a flag whose value differs from the run's.
"""

from __future__ import annotations

import dataclasses
import json
import types
import typing

from llamablock.commands import UsageError
from llamablock.config import ModelConfig
from llamablock.presets import ARCH_PRESETS as ARCHS
from llamablock.presets import PRESETS, preset


def parse_overrides(items: list[str] | None) -> dict:
    """ModelConfig field values from `--set field=value` strings, each converted to a type its
    annotation allows: int, float, bool (true/false/1/0), str, a JSON object for dict fields, and
    none/null where the field may be None. The values themselves are checked when a config is built
    from them (ModelConfig.validate). Raises ValueError for an unknown field or a value of the wrong
    type, naming the first bad item; vocab_size is the tokenizer's, not a field to set."""
    hints = typing.get_type_hints(ModelConfig)
    allowed = {}  # field -> the python types its annotation allows (NoneType included)
    for f in dataclasses.fields(ModelConfig):
        hint = hints[f.name]
        union = isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union
        allowed[f.name] = tuple(typing.get_origin(a) or a for a in (typing.get_args(hint) if union else (hint,)))
    out = {}
    for item in items or []:  # one at a time: the first bad item is the one reported
        if "=" not in item:
            raise ValueError(f"--set expects field=value, got {item!r}")
        name, text = item.split("=", 1)
        name = name.strip()
        if name == "vocab_size":
            raise UsageError("--set vocab_size: the vocabulary size is taken from the tokenizer (use --tokenizer)")
        if name not in allowed:
            raise ValueError(f"--set: unknown field {name!r}; ModelConfig fields are {', '.join(sorted(allowed))}")
        out[name] = _convert(name, text.strip(), allowed[name])
    return out


def _convert(name: str, text: str, allowed: tuple):
    """`text` as the first of the `allowed` types it parses as (parse_overrides)."""
    if type(None) in allowed and text.lower() in ("none", "null"):
        return None
    for kind in allowed:
        if kind is bool and text.lower() in ("true", "false", "1", "0"):
            return text.lower() in ("true", "1")
        if kind in (int, float):
            try:
                return kind(text)
            except ValueError:
                pass
        if kind is dict:
            try:
                value = json.loads(text)
            except json.JSONDecodeError:
                continue
            if isinstance(value, dict):
                return value
        if kind is str:
            return text
    names = " or ".join("None" if k is type(None) else ("a JSON object" if k is dict else k.__name__) for k in allowed)
    raise ValueError(f"--set {name}={text}: {name} expects {names}")


def config_from_flags(preset_name: str | None, arch: str | None, overrides: list[str] | None) -> ModelConfig:
    if arch is not None and preset_name is not None and ARCHS[arch] != preset_name:
        raise UsageError(f"--arch {arch} means --preset {ARCHS[arch]}; give one of the two")
    name = ARCHS[arch] if arch is not None else (preset_name or "gpt-2017-small")
    if name not in PRESETS:
        raise UsageError(f"unknown preset {name!r}; known presets: {', '.join(sorted(PRESETS))}")
    return preset(name, **parse_overrides(overrides))


def add_arguments(p) -> None:
    from llamablock.training.train import TrainConfig

    d = TrainConfig()
    p.add_argument("--preset", help="model preset (default gpt-2017-small); the vocabulary comes from the tokenizer")
    p.add_argument("--arch", choices=sorted(ARCHS), help="shortcut: 2017 = gpt-2017-small, 2024 = llama-2024-small")
    p.add_argument("--set", action="append", metavar="FIELD=VALUE", dest="overrides",
                   help="override a ModelConfig field, type-checked (repeatable), e.g. --set n_kv_heads=2")
    p.add_argument("--out", help="run directory for checkpoints, log.jsonl and curves.png: a new or empty folder "
                                 "(an existing run is continued with --resume, never overwritten)")
    p.add_argument("--resume", action="store_true", help="continue from the newest checkpoint in --out (model and "
                   "train flags may be repeated unchanged; a changed one is refused)")
    p.add_argument("--steps", type=int, help=f"optimizer steps in total (default {d.steps})")
    p.add_argument("--batch-size", type=int, help=f"global batch in windows (default {d.batch_size})")
    p.add_argument("--context", type=int, help=f"tokens per window (default {d.context})")
    p.add_argument("--lr", type=float, help=f"peak learning rate (default {d.lr})")
    p.add_argument("--warmup", type=int, help=f"linear warm-up steps (default {d.warmup})")
    p.add_argument("--min-lr-ratio", type=float, help=f"cosine floor / peak (default {d.min_lr_ratio})")
    p.add_argument("--weight-decay", type=float, help=f"AdamW decay on matrices (default {d.weight_decay})")
    p.add_argument("--grad-clip", type=float, help=f"global gradient norm clip (default {d.grad_clip})")
    p.add_argument("--eval-every", type=int, help=f"evaluate and checkpoint every K steps (default {d.eval_every})")
    p.add_argument("--eval-windows", type=int, help=f"validation windows (default {d.eval_windows})")
    p.add_argument("--seed", type=int, help=f"seed for weights and batches (default {d.seed})")
    p.add_argument("--corpus", choices=("tiny", "all"), help=f"nine plays or all 38 (default {d.corpus})")
    p.add_argument("--tokenizer", choices=("char", "bpe"), help=f"characters or byte-level BPE (default {d.tokenizer})")
    p.add_argument("--bpe-vocab", type=int, help=f"BPE vocabulary size (default {d.bpe_vocab})")
    p.add_argument("--device", choices=("cpu", "cuda"), help="device (default: cpu; cuda with NCCL under torchrun on GPUs)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")


TRAIN_FLAGS = ("batch_size", "context", "lr", "warmup", "min_lr_ratio", "weight_decay", "grad_clip", "eval_every",
               "eval_windows", "seed", "corpus", "tokenizer", "bpe_vocab")


def _train_flags(args) -> dict:
    """The TrainConfig fields given on the command line (None: not given)."""
    return {k: getattr(args, k) for k in TRAIN_FLAGS}


def _resume_model(args) -> dict | None:
    """The ModelConfig fields the model flags of a --resume imply, for comparison with the run's own:
    with --preset or --arch the whole preset (and --set), with --set alone just those fields."""
    if args.preset or args.arch:
        return config_from_flags(args.preset, args.arch, args.overrides).to_dict()
    return parse_overrides(args.overrides) or None


def run(args) -> int:
    from llamablock.training import distributed as dd
    from llamablock.training.train import TrainConfig, train
    from llamablock.util.devices import resolve_device

    if args.out is not None and not args.out.strip():
        raise UsageError("--out is empty: give the folder of the run (a new one, or the run to --resume)")
    if args.steps is not None and args.steps <= 0:
        raise UsageError(f"--steps must be at least 1, got {args.steps}")
    if args.device is not None:  # refused here, as generate refuses it, before the run's folder is touched
        resolve_device(args.device)
    resume_model = None
    if args.resume:
        if not args.out:
            raise UsageError("--resume needs --out, the run directory that holds the checkpoint")
        resume_model = _resume_model(args)  # an unchanged flag is accepted, a changed one refused by name
        cfg, tcfg = None, None
    else:
        cfg = config_from_flags(args.preset, args.arch, args.overrides)
        tcfg = TrainConfig(**{k: v for k, v in _train_flags(args).items() if v is not None},
                           steps=args.steps if args.steps is not None else TrainConfig.steps)
    info = dd.from_env(args.device)
    try:
        result = train(cfg, tcfg, args.out, resume=args.resume, progress=not args.no_progress, info=info,
                       steps=args.steps if args.resume else None, resume_flags=_train_flags(args),
                       resume_model=resume_model)
    finally:
        dd.shutdown(info)
    if info.is_main and result.get("exported_only"):
        print(f"the run was finished; wrote its missing final export {args.out}/export (step {result['step']})")
    elif info.is_main:
        c = result["config"]
        print(f"trained {c.position}/{c.norm}-{c.norm_placement}/{c.ffn}/kv{c.n_kv_heads} "
              f"({result['params']:,} parameters) to step {result['step']}: "
              f"validation loss {result['val_loss']:.4f} nats/token, {result['tokens_per_s']:,.0f} tokens/s"
              + (f"; run directory {args.out}" if args.out else ""))
    return 0

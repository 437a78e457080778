"""`llamablock kv-cache`: KV-cache bytes per token, per layer and in total, for MHA, GQA and MQA.

`--dtype auto` (the default) counts the dtype `generate` keeps a quantized model's cache in on this
CPU (fast/plan.py kv_dtype: its 16-bit type), and the header line says which."""

from __future__ import annotations

import json
from pathlib import Path

from llamablock.config import ModelConfig
from llamablock.diagnostics.kv_calculator import layouts
from llamablock.io.hf_config import config_from_file
from llamablock.presets import PRESETS, preset
from llamablock.util.units import DTYPE_BYTES, human_bytes


def add_arguments(p) -> None:
    p.add_argument("--config", required=True,
                   help=f"a preset name ({', '.join(sorted(PRESETS))}) or a transformers config.json path")
    p.add_argument("--tokens", type=int, required=True, help="context length L in tokens")
    p.add_argument("--batch", type=int, default=1, help="sequences in the batch (default: %(default)s)")
    p.add_argument("--dtype", default="auto", choices=["auto", *sorted(DTYPE_BYTES)],
                   help="element type of the cache; auto: the one `generate` keeps a quantized model's cache in on "
                        "this CPU (bfloat16 or float16 by its support; a float32 model keeps float32) "
                        "(default: %(default)s)")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")


def load_config(name_or_path: str) -> ModelConfig:
    if name_or_path in PRESETS:
        return preset(name_or_path)
    if Path(name_or_path).exists():
        return config_from_file(name_or_path)
    raise ValueError(f"--config {name_or_path!r} is neither a preset ({', '.join(sorted(PRESETS))}) nor a file")


def auto_dtype() -> str:
    """The KV cache dtype of a quantized model (the file's blocks, float32 activations) on this CPU:
    the plan's rule (fast/plan.py kv_dtype) with this CPU's 16-bit type (fast/machine.py kv16_for)."""
    from llamablock.fast.machine import kv16_for
    from llamablock.fast.plan import kv_dtype
    from llamablock.util.cpu import this_cpu

    return kv_dtype("auto", {"formats": {"*": "blocks"}, "activations": "float32"}, kv16_for(this_cpu()))


def run(args) -> int:
    cfg = load_config(args.config)
    dtype = auto_dtype() if args.dtype == "auto" else args.dtype
    said = (f"{dtype} (auto: a quantized model's cache on this CPU; a float32 model keeps float32)"
            if args.dtype == "auto" else dtype)
    rows = layouts(cfg, args.tokens, args.batch, dtype)
    if args.json:
        print(json.dumps({"config": args.config, "tokens": args.tokens, "batch": args.batch, "dtype": dtype,
                          "configured_kv_heads": cfg.n_kv_heads, "layouts": [r.to_dict() for r in rows]}, indent=2))
        return 0
    windowed = cfg.layer_kinds.count("sliding")
    window = (f", sliding window {cfg.sliding_window}" + (f" on {windowed} of them" if windowed < cfg.n_layers else "")
              if windowed else "")
    print(f"{args.config}: {cfg.n_layers} layers, {cfg.n_heads} query heads, head_dim {cfg.head_dim}{window}; "
          f"{args.tokens} tokens x batch {args.batch}, {said}")
    print(f"{'layout':<6}{'kv heads':>9}{'per token':>14}{'per layer' if not windowed else 'windowed layer':>16}"
          f"{'total':>14}")
    for r in rows:
        mark = "  <- this model" if r.kv_heads == cfg.n_kv_heads else ""
        print(f"{r.layout:<6}{r.kv_heads:>9}{human_bytes(r.bytes_per_token):>14}{human_bytes(r.bytes_per_layer):>16}"
              f"{human_bytes(r.total_bytes):>14}{mark}")
    return 0

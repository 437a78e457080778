"""`llamablock export RUN_DIR OUT [--format auto|hf|gguf|llamablock]`: a trained model for other tools.

The latest checkpoint of a run directory (`llamablock train --out`) becomes a transformers
directory, a GGUF file or a llamablock directory (llamablock.io.export says what each holds).
"auto" writes transformers where a transformers class computes exactly what the model computes
(the 2024 model) and a llamablock directory otherwise (the 2017 model: post-LN LayerNorm, learned
positions, biases), and says which it wrote and why. OUT is written only when it is new or an
earlier export (llamablock.io.export.export_target); the checkpoint only when it passes its checks.
"""

from __future__ import annotations

from llamablock.commands import UsageError


def add_arguments(p) -> None:
    p.add_argument("run", metavar="RUN_DIR",
                   help="a training run directory (its latest checkpoint) or one checkpoint folder in it")
    p.add_argument("out", metavar="OUT", help="the directory to write (hf, llamablock) or the .gguf file (gguf): a new "
                                              "path, or an earlier export, which is replaced whole")
    p.add_argument("--format", choices=("auto", "hf", "gguf", "llamablock"), default="auto",
                   help="hf: transformers directory; gguf: one llama.cpp file; llamablock: our own directory; "
                        "auto: hf when a transformers class matches the model, llamablock otherwise "
                        "(default: %(default)s)")


def run(args) -> int:
    from llamablock.io.export import export_model, export_target, transformers_family
    from llamablock.io.llamablock_dir import load_checkpoint
    from llamablock.io.resolve import is_checkpoint, resolve_model

    source = resolve_model(args.run)  # a run's latest checkpoint; its own loader verifies it (no ModelSource)
    if not is_checkpoint(source):
        raise UsageError(f"{args.run} is not a training run directory (no checkpoints/latest) nor a checkpoint "
                         "folder (state.json and model.safetensors); train one with `llamablock train --out DIR`")
    if args.format == "gguf" and not args.out.endswith(".gguf"):
        raise UsageError(f"a GGUF export is one file: give OUT ending in .gguf, got {args.out!r}")
    export_target(args.out, args.format)  # refused before the model is read: OUT is not ours to replace
    model, _, state = load_checkpoint(source, verify=True)
    fmt, path = export_model(model, state["tokenizer"], args.out, args.format)
    family, why = transformers_family(model.cfg)
    print(f"wrote {path} ({fmt}) from {source}")
    if fmt == "hf":
        print(f"  transformers: AutoModelForCausalLM.from_pretrained({str(path)!r}) ({family}); "
              f"llamablock: llamablock generate --model {path}")
    elif fmt == "gguf":
        print(f"  llama.cpp: llama-cli -m {path} --ignore-eos (a character model has no end token); "
              f"llamablock: llamablock generate --model {path}")
    elif why is not None:
        print(f"  a llamablock directory: no transformers or llama.cpp architecture matches this model "
              f"({why}), so only llamablock reads it: llamablock generate --model {path}")
    else:
        print(f"  a llamablock directory (as asked; --format hf writes one transformers reads): "
              f"llamablock generate --model {path}")
    return 0

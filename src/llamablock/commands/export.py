"""`llamablock export RUN_DIR OUT [--format auto|hf|gguf|llamablock]`: a trained model for other tools.

The latest checkpoint of a run directory (`llamablock train --out`) becomes a transformers
directory, a GGUF file or a llamablock directory (llamablock.io.export says what each holds).
"auto" writes transformers where a transformers class computes exactly what the model computes
(the 2024 model) and a llamablock directory otherwise (the 2017 model: post-LN LayerNorm, learned
positions, biases), and says which it wrote and why. OUT is written only when it is new or an
earlier export (llamablock.io.export.export_target); the checkpoint only when it passes its checks.

The context and RoPE-scaling flags of generate and serve (io/scaling_flags.py, llama.cpp's names)
write a scaling into the export, where other runtimes read it: `rope_scaling` in config.json and
`<arch>.rope.scaling.*` and `.context_length` in a GGUF file. A model whose config already scales
RoPE keeps its scaling unless --rope-scaling replaces it.

A run still being trained is read under its readers lock (io/llamablock_dir.py), so the
checkpoint resolved is not deleted while it is read; when `latest` names no complete checkpoint
while training holds the run, one line says so and names the newest complete one.
"""

from __future__ import annotations

from pathlib import Path

from llamablock.commands import UsageError
from llamablock.io.scaling_flags import add_scaling_arguments, check_flags


def add_arguments(p) -> None:
    p.add_argument("run", metavar="RUN_DIR",
                   help="a training run directory (its latest checkpoint) or one checkpoint folder in it")
    p.add_argument("out", metavar="OUT", help="the directory to write (hf, llamablock) or the .gguf file (gguf): a new "
                                              "path, or an earlier export, which is replaced whole")
    p.add_argument("--format", choices=("auto", "hf", "gguf", "llamablock"), default="auto",
                   help="hf: transformers directory; gguf: one llama.cpp file; llamablock: our own directory; "
                        "auto: hf when a transformers class matches the model, llamablock otherwise "
                        "(default: %(default)s)")
    add_scaling_arguments(p)


def run(args) -> int:
    from llamablock.io.export import export_model, export_target, transformers_family, with_config
    from llamablock.io.llamablock_dir import checkpoint_readers, load_checkpoint
    from llamablock.io.resolve import is_checkpoint, resolve_model
    from llamablock.io.scaling_flags import export_config

    check_flags(args)
    if args.format == "gguf" and not args.out.endswith(".gguf"):
        raise UsageError(f"a GGUF export is one file: give OUT ending in .gguf, got {args.out!r}")
    with checkpoint_readers(args.run):  # no trainer deletes the checkpoint while it is read
        try:
            source = resolve_model(args.run)  # a run's latest checkpoint; its loader verifies it (no ModelSource)
        except FileNotFoundError as e:
            raise FileNotFoundError(_while_training(args.run) or str(e)) from None
        if not is_checkpoint(source):
            raise UsageError(f"{args.run} is not a training run directory (no checkpoints/latest) nor a checkpoint "
                             "folder (state.json and model.safetensors); train one with `llamablock train --out DIR`")
        export_target(args.out, args.format)  # refused before the model is read: OUT is not ours to replace
        model, _, state = load_checkpoint(source, verify=True)
    model = with_config(model, export_config(model.cfg, args))
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


def _while_training(run: str) -> str | None:
    """When a trainer holds the run of `run` (a run or one of its checkpoint folders) and no complete
    checkpoint is where `run` points: one line saying so, naming the newest complete checkpoint to
    export instead; None otherwise."""
    import fcntl
    import os

    from llamablock.io.resolve import is_checkpoint

    root = Path(run)
    if not (root / "checkpoints").is_dir() and root.parent.name == "checkpoints":
        root = root.parent.parent  # a checkpoint folder given by name
    try:  # O_NONBLOCK: a FIFO in the lock's place must not hang the open
        fd = os.open(root / ".lock", os.O_RDONLY | os.O_NONBLOCK)
    except OSError:  # no lock file: no trainer there
        return None
    try:  # a shared probe, let go at once: a running trainer holds it exclusively
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        return None
    except BlockingIOError:
        pass
    finally:
        os.close(fd)
    complete = sorted(p for p in (root / "checkpoints").glob("step-*") if is_checkpoint(p))
    use = (f"its newest complete checkpoint is {complete[-1].name}: export that one (`llamablock export "
           f"{complete[-1]} OUT`) or wait for training to end" if complete else "no checkpoint is complete yet: wait")
    return f"training is writing to {root} and {run} names no complete checkpoint now; {use}"

"""The `llamablock` command line. Thin: each subcommand lives in llamablock/commands/<name>.py
with `add_arguments(parser)` and `run(args) -> int`, and is imported only when used.

User mistakes (a ValueError or FileNotFoundError raised with a clear message) end the
command with one line on stderr and exit status 2, never a traceback.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from llamablock.commands import UsageError

# name -> (module, one-line help). Add a line here when adding a command module.
COMMANDS: dict[str, tuple[str, str]] = {
    "lab": ("llamablock.commands.lab", "measure every claim of the module; write report.md and results.json"),
    "rope": ("llamablock.commands.rope", "per-pair table of every RoPE context-extension method; lint RoPE settings"),
    "train": ("llamablock.commands.train", "train a preset on Shakespeare (AdamW, cosine, checkpoints, --resume; torchrun for DDP)"),
    "trace": ("llamablock.commands.trace", "one text through a trained 2017 and 2024 model, stage by stage (trains them on first use)"),
    "compare": ("llamablock.commands.compare", "train 2017, 2024 and each single change between them at equal parameters; table and plot"),
    "demo": ("llamablock.commands.demo", "build the 2017 and 2024 blocks, compare parameters, run a forward pass"),
    "serve": ("llamablock.commands.serve", "the interactive page of the five figures, computed by the library"),
    "kv-cache": ("llamablock.commands.kv_cache", "KV-cache bytes per token, per layer and in total (MHA, GQA, MQA)"),
    "generate": ("llamablock.commands.generate", "continue a prompt or chat with a real model (GGUF or transformers), streaming"),
    "perplexity": ("llamablock.commands.perplexity", "perplexity of a model on a text file, sliding window"),
    "bench": ("llamablock.commands.bench", "speed benchmarks side by side (attention, norms, decode, ...); BENCHMARKS.md"),
    "cache": ("llamablock.commands.cache", "what llamablock keeps on disk (compiled programs, inductor's caches, tracer models); --clear"),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="llamablock",
        description="The 2017 Transformer block and the 2024 LLaMA block: measured, run, trained and shown.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (module, help_text) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        importlib.import_module(module).add_arguments(p)
        p.set_defaults(_module=module)
    return parser


def main(argv: list[str] | None = None) -> int:
    from llamablock.fast.compile_cache import use_persistent_cache
    from llamablock.fast.malloc import tune_allocator

    tune_allocator()  # glibc: keep large tensor buffers instead of refaulting them (llamablock.fast.malloc)
    use_persistent_cache()  # torch.compile's caches under ~/.cache, not /tmp (llamablock.fast.compile_cache)
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(importlib.import_module(args._module).run(args) or 0)
    except (UsageError, ValueError, FileNotFoundError, NotADirectoryError) as e:
        print(f"llamablock {args.command}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"llamablock {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())

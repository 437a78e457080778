"""The `llamablock` command line. Thin: each subcommand lives in llamablock/commands/<name>.py
with `add_arguments(parser)` and `run(args) -> int`, and only the one that runs is imported, so
`llamablock --help` and `--version` answer without importing torch.

Every command that computes takes `--threads N` (set here, once, for torch's intra-op pool and
restored afterwards); the default is llamablock.util.threads.default_threads (the physical
cores, as llama.cpp). The commands that run a model (INFERENCE) flush denormals to zero while
they run (llamablock.util.denormals). `serve`, which steps its model from a second thread, keeps
OpenMP's spin between parallel regions (llamablock.util.openmp), set before torch is imported.
User mistakes (a ValueError or FileNotFoundError raised with a clear message) end the command
with one line on stderr and exit status 2, never a traceback. Output piped into a reader that
stops early (`| head`) ends quietly.
"""

from __future__ import annotations

import argparse
import gc
import importlib
import os
import sys

from llamablock.commands import UsageError
from llamablock.util.threads import default_threads

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
    "export": ("llamablock.commands.export", "a trained run as a transformers directory, a GGUF file or a llamablock directory"),
    "perplexity": ("llamablock.commands.perplexity", "perplexity of a model on a text file, sliding window"),
    "bench": ("llamablock.commands.bench", "speed benchmarks side by side (attention, norms, decode, ...); BENCHMARKS.md"),
    "cache": ("llamablock.commands.cache", "what llamablock keeps on disk (compiled programs, builds index, inductor's caches, kernel libraries, rope eval's losses, tracer models, temporary folders); --clear"),
    "compile": ("llamablock.commands.compile", "build the compiled engine for a model once; generate then uses it by default"),
    "models": ("llamablock.commands.models", "the models llamablock ships or knows by name: embedded checkpoints and presets"),
}
# The commands that compute with torch, and so take --threads.
COMPUTES = ("lab", "rope", "train", "trace", "compare", "demo", "serve", "generate", "perplexity", "bench", "compile")
# The commands that run a model for its outputs, with denormals flushed to zero (util/denormals.py)
INFERENCE = ("serve", "generate", "perplexity", "compile")


def version() -> str:
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as installed

    try:
        return installed("llamablock")
    except PackageNotFoundError:
        return "unknown (not installed; pip install -e .)"


def _threads(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expects a whole number of threads, got {text!r}") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {n}")
    return n


def _command(argv: list[str]) -> str | None:
    """The command `argv` names (its first word that is not a flag), before any parsing."""
    return next((a for a in argv if not a.startswith("-")), None)


def build_parser(argv: list[str] | None = None) -> argparse.ArgumentParser:
    """The parser; only the command named in `argv` (None: every command) gets its arguments,
    which imports that command's module alone."""
    parser = argparse.ArgumentParser(
        prog="llamablock",
        description="The 2017 Transformer block and the 2024 LLaMA block: measured, run, trained and shown.")
    parser.add_argument("--version", action="version", version=f"llamablock {version()}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    chosen = _command(argv) if argv is not None else None
    for name, (module, help_text) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        p.set_defaults(_module=module)
        if argv is None or name == chosen:
            importlib.import_module(module).add_arguments(p)
            if name in COMPUTES:
                p.add_argument("--threads", type=_threads, default=None, metavar="N",
                               help=f"torch threads (default: the physical CPU cores; here {default_threads()})")
    return parser


def main(argv: list[str] | None = None) -> int:
    own_process = argv is None  # the command line's process, not a program or a test calling main(argv)
    argv = sys.argv[1:] if argv is None else list(argv)
    if _command(argv) == "serve":  # steps from a second thread: OpenMP's spin kept (util/openmp.py), set
        from llamablock.util.openmp import keep_spinning  # before torch's import reads it

        keep_spinning()
    from llamablock.fast.compiled.compile_cache import use_persistent_cache
    from llamablock.fast.kernels.malloc import tune_allocator

    # In the command's own process, no collection while its modules (torch's among them) are imported,
    # then those objects frozen: they live as long as the process, and each collection walked every one
    # of them, during the imports and again after (`llamablock bench startup` times the stages). Not for
    # a caller's process, whose garbage of the moment freezing would keep for good.
    if own_process:
        gc.disable()
    args = build_parser(argv).parse_args(argv)
    tune_allocator()  # glibc: keep large tensor buffers instead of refaulting them (llamablock.fast.kernels.malloc)
    use_persistent_cache()  # torch.compile's caches under ~/.cache, not /tmp (llamablock.fast.compiled.compile_cache)
    try:
        module = importlib.import_module(args._module)
        if own_process:
            gc.freeze()
            gc.enable()
        if args.command not in COMPUTES:
            return int(module.run(args) or 0)
        import torch

        if args.threads is None:
            args.threads = default_threads()
        before = torch.get_num_threads()
        torch.set_num_threads(args.threads)
        try:
            if args.command not in INFERENCE:
                return int(module.run(args) or 0)
            from llamablock.util.denormals import flushed_denormals

            with flushed_denormals():
                return int(module.run(args) or 0)
        finally:  # an embedding program (or a test) keeps its own setting
            torch.set_num_threads(before)
    except (UsageError, ValueError, FileNotFoundError, NotADirectoryError) as e:
        print(f"llamablock {args.command}: error: {_one_line(e)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"llamablock {args.command}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # The reader stopped (`| head`): send what is left of our output nowhere and end quietly.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except OSError as e:  # a full disk, a read-only folder: one line, as for any other mistake
        print(f"llamablock {args.command}: error: {_one_line(e)}", file=sys.stderr)
        return 2


def _one_line(e: Exception) -> str:
    """The message of a refusal as one line: an operating-system error as "what: which file"
    (not "[Errno 20] Not a directory: PosixPath(...)"), any other message with its newlines folded."""
    if isinstance(e, OSError) and e.errno is not None and e.strerror:
        return e.strerror + (f": {e.filename}" if e.filename else "")
    return " ".join(str(e).split("\n")).strip() or type(e).__name__


if __name__ == "__main__":
    sys.exit(main())

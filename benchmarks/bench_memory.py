"""Peak memory of a run by weight format, beside its decode speed (SmolLM2-135M's Q4_1 GGUF).

Each row is a child process that loads the model as `llamablock generate --dtype FORMAT` does
(llamablock.io.source.open_source and llamablock.fast.kernels.native.load_in_format, the command line's allocator settings), generates 32 tokens
eagerly on one thread, and reports its peak resident memory above the same interpreter with torch
imported (Linux's VmHWM, reset before loading), the resident memory after generating, the bytes
of the weights it holds, and the decode tokens/s. `auto` reads the GGUF straight into the packed
layers; `q8`/`q4` load the whole model in bfloat16 first, then quantize. The last row loads a
larger file of the same kind (benchmarks/scaled_gguf.py: SmolLM2-1.7B's shapes, random weights),
to show how the peak scales with the file once the fixed costs (libraries, tokenizer) are
shared out. --quick: 4 tokens, and a small scaled file instead.
"""

from __future__ import annotations

import os

from benchmarks.common import Section, run_child, verdict

NAME = "memory"
CLAIM = "a quantized GGUF runs in at most about 1.5x its file size above the interpreter with torch loaded"
FORMATS = ("auto", "q4", "q8", "bfloat16", "float32")

CHILD = r"""
import json, sys, torch
torch.set_num_threads(1)
from llamablock.fast.kernels.malloc import tune_allocator
tune_allocator()
from llamablock.fast.plan import load_in_format
from llamablock.io.source import open_source
from llamablock.runtime.engine import EagerEngine
from llamablock.runtime.generate import generate

def kib(field):
    return next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith(field + ":"))

open("/proc/self/clear_refs", "w").write("5")  # the peak (VmHWM) counts from here
before = kib("VmRSS")
source = open_source(sys.argv[3] or None)
(model, what), tok = load_in_format(source, sys.argv[1]), source.tokenizer
g = generate(EagerEngine(model), tok.encode("The capital of France is"), int(sys.argv[2]), eos_ids=())
storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in [*model.parameters(), *model.buffers()]}
print(json.dumps({"peak": (kib("VmHWM") - before) * 1024, "after": (kib("VmRSS") - before) * 1024,
                  "weights": sum(storages.values()), "tokens_per_s": g.decode_tokens_per_s, "what": what}))
"""


def mib(n: float) -> str:
    return f"{n / 2**20:.0f}"


def run(quick: bool = False) -> list[Section]:
    import tempfile
    from pathlib import Path

    from benchmarks.scaled_gguf import write_scaled
    from llamablock.io.resolve import resolve_model

    src = resolve_model(None)
    size = os.path.getsize(src)
    sec = Section(f"SmolLM2-135M-Instruct (Q4_1 GGUF, {size / 2**20:.0f} MiB) and a larger file of its kind: peak "
                  "memory above the interpreter with torch loaded, and eager decode on one thread",
                  ["file", "--dtype", "weights", "weights MiB", "peak MiB", "after MiB", "peak / file size",
                   "decode tok/s"])
    def row(label: str, fmt: str, path: str, file_size: int) -> dict:
        r = run_child(CHILD, fmt, "4" if quick else "32", path)
        sec.rows.append([label, fmt, r["what"], mib(r["weights"]), mib(r["peak"]), mib(r["after"]),
                         f"{r['peak'] / file_size:.2f}", f"{r['tokens_per_s']:.1f}"])
        return r

    results = {fmt: row("SmolLM2-135M", fmt, "", size) for fmt in FORMATS}
    auto = results["auto"]
    sec.notes.append(verdict("peak / file size with --dtype auto", auto["peak"] / size, 1.5,
                             higher_is_better=False, unit="x"))
    sec.notes.append(f"Where the auto row's peak goes: weights {mib(auto['weights'])} MiB "
                     f"({auto['weights'] / size:.2f}x the file), and {mib(auto['after'] - auto['weights'])} MiB "
                     "resident beside them after generating (the libraries the load imports, the tokenizer, the "
                     f"KV cache); the peak is {mib(auto['peak'] - auto['after'])} MiB above that (one tensor's "
                     "temporaries and heap not yet returned, at the end of the load).")
    shape = (768, 4, 12, 4, 2048) if quick else (2048, 24, 32, 32, 8192)  # quick: small; else SmolLM2-1.7B's
    with tempfile.TemporaryDirectory() as tmp:
        big = write_scaled(src, Path(tmp) / "scaled.gguf", *shape)
        big_size = os.path.getsize(big)
        label = f"scaled, d {shape[0]} x {shape[1]} layers, ffn {shape[4]} ({big_size / 2**20:.0f} MiB)"
        r = row(label, "auto", str(big), big_size)
    sec.notes.append(verdict(f"peak / file size with --dtype auto, the {big_size / 2**20:.0f} MiB scaled file",
                             r["peak"] / big_size, 1.5, higher_is_better=False, unit="x"))
    return [sec]

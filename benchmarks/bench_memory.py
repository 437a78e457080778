"""Peak memory of a run by weight format, beside its decode speed (SmolLM2-135M's Q4_1 GGUF).

Each row is a child process that loads the model as `llamablock generate --dtype FORMAT` does
(llamablock.fast.native.load_model, the command line's allocator settings), generates 32 tokens
eagerly on one thread, and reports its peak resident memory above the same interpreter with torch
imported (Linux's VmHWM, reset before loading), and the decode tokens/s. `auto` reads the GGUF
straight into the packed layers; `q8`/`q4` load the whole model in bfloat16 first, then quantize.
--quick: a tiny random GGUF written by the tests' writer is not available here, so it loads the
same file and generates 4 tokens.
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
from llamablock.fast.malloc import tune_allocator
tune_allocator()
from llamablock.fast.native import load_model
from llamablock.runtime.generate import generate

def kib(field):
    return next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith(field + ":"))

open("/proc/self/clear_refs", "w").write("5")  # the peak (VmHWM) counts from here
before = kib("VmRSS")
model, tok, what = load_model(None, sys.argv[1])
g = generate(model, tok.encode("The capital of France is"), int(sys.argv[2]), eos_ids=())
print(json.dumps({"peak": (kib("VmHWM") - before) * 1024, "tokens_per_s": g.decode_tokens_per_s, "what": what}))
"""


def run(quick: bool = False) -> list[Section]:
    from llamablock.io.resolve import resolve_model

    size = os.path.getsize(resolve_model(None))
    sec = Section(f"SmolLM2-135M-Instruct (Q4_1 GGUF, {size / 2**20:.0f} MiB): peak memory above the interpreter "
                  "with torch loaded, and eager decode on one thread",
                  ["--dtype", "weights", "peak MiB", "peak / file size", "decode tok/s"])
    results = {}
    for fmt in FORMATS:
        r = run_child(CHILD, fmt, "4" if quick else "32")
        results[fmt] = r
        sec.rows.append([fmt, r["what"], f"{r['peak'] / 2**20:.0f}", f"{r['peak'] / size:.2f}", f"{r['tokens_per_s']:.1f}"])
    sec.notes.append(verdict("peak / file size with --dtype auto", results["auto"]["peak"] / size, 1.5,
                             higher_is_better=False, unit="x"))
    return [sec]

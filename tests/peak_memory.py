"""Peak resident memory of a `generate --dtype auto` run, measured in a child process: the growth
of Linux's VmHWM over an interpreter with torch loaded, at the end of the load and after 32 tokens
of eager decode on one thread, as `llamablock bench memory` measures it."""

from __future__ import annotations

import json
import subprocess
import sys

PEAK = r"""
import json, sys, torch
torch.set_num_threads(1)
from llamablock.fast.kernels.malloc import tune_allocator
tune_allocator()  # as the command line runs
from llamablock.fast.plan import load_in_format
from llamablock.io.source import open_source
from llamablock.runtime.engine import EagerEngine
from llamablock.runtime.generate import generate

def kib(field):
    return next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith(field + ":"))

open("/proc/self/clear_refs", "w").write("5")  # start the peak (VmHWM) afresh from here
before = kib("VmRSS")
source = open_source(sys.argv[1])
(model, _), tok = load_in_format(source, "auto"), source.tokenizer
load = (kib("VmHWM") - before) * 1024
generate(EagerEngine(model), tok.encode("The capital of France is"), 32, eos_ids=())
print(json.dumps([load, (kib("VmHWM") - before) * 1024]))
"""


def peak_memory(path: str) -> tuple[int, int]:
    """(bytes at the end of the load, bytes after the decode) above the interpreter with torch."""
    out = subprocess.run([sys.executable, "-c", PEAK, str(path)], capture_output=True, text=True, check=True).stdout
    load, run = json.loads(out.splitlines()[-1])
    return load, run

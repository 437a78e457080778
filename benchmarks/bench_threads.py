"""Decode speed by torch thread count, on an idle machine and with one core held by another process.

The command line's default thread count (llamablock.util.threads.default_threads: the physical
cores, as llama.cpp) is chosen for the first case, a user's machine; the second shows what it costs
on a shared one, where a parallel region waits for its slowest thread, so with a core taken by
another process every thread beyond the free cores makes each op wait (`--threads` sets fewer
there). Each row is a
child process decoding with the eager model (SmolLM2-135M in float32; --quick: a tiny random
model) at one thread count; the "held" rows run while a second child spins on one core. The
ratio column is that row's tokens/s over the best of its case; the target line checks the default.
"""

from __future__ import annotations

import subprocess
import sys

from benchmarks.common import Section, run_child, verdict
from llamablock.util.threads import available_cores, default_threads

NAME = "threads"
CLAIM = "on an idle machine, the default thread count decodes within 1.1x of the best"

CHILD = r"""
import json, sys, time, torch
threads, quick, steps = int(sys.argv[1]), sys.argv[2] == "quick", int(sys.argv[3])
torch.set_num_threads(threads)
if quick:
    from llamablock.config import ModelConfig
    from llamablock.model import Decoder
    model = Decoder(ModelConfig(vocab_size=256, d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, max_seq_len=128)).eval()
else:
    import llamablock
    model = llamablock.load_pretrained(None)
from llamablock.runtime.engine import EagerEngine
from llamablock.runtime.generate import generate
prompt = list(range(1, 33))
generate(EagerEngine(model), prompt, 4)  # warm-up
best = 0.0
for _ in range(3):
    g = generate(EagerEngine(model), prompt, steps, eos_ids=())
    best = max(best, g.decode_tokens_per_s)
print(json.dumps({"tokens_per_s": best}))
"""

SPIN = "while True: pass"


def _decode(threads: int, quick: bool) -> float:
    return run_child(CHILD, str(threads), "quick" if quick else "full", "8" if quick else "32")["tokens_per_s"]


def run(quick: bool = False) -> list[Section]:
    cores = available_cores()
    counts = sorted({1, default_threads(), cores})
    what = "a 2-layer random model" if quick else "SmolLM2-135M, float32"
    sec = Section(f"Eager decode by torch threads ({what}, batch 1, best of 3 runs, {cores} cores)",
                  ["machine", "threads", "tokens/s", "of the best"])
    results = {}
    for case in ("idle", "one core held"):
        spinner = subprocess.Popen([sys.executable, "-c", SPIN]) if case != "idle" else None
        try:
            results[case] = {n: _decode(n, quick) for n in counts}
        finally:
            if spinner is not None:
                spinner.kill()
                spinner.wait()
        best = max(results[case].values())
        for n, tps in results[case].items():
            mark = " (default)" if n == default_threads() else ""
            sec.rows.append([case, f"{n}{mark}", f"{tps:.1f}", f"{tps / best:.2f}"])
    idle = results["idle"]
    sec.notes.append(verdict("best / default tokens/s on an idle machine", max(idle.values()) / idle[default_threads()],
                             1.1, higher_is_better=False, unit="x"))
    return [sec]

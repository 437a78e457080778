"""One pass of `llamablock rope eval`: the loss of every token of a long sequence, time and peak
memory at 8k, 16k and 32k tokens, against the target of a pass at 32k in under 4 GB on a CPU.

What a pass must not hold: a dense score or mask tensor, (heads, T, T) per layer, and the full
logits, (T, vocabulary). SmolLM2-135M at 32,768 tokens would need 9 x 32768^2 x 4 bytes = 36 GiB
for one layer's scores and 32768 x 49152 x 4 = 6 GiB for the logits. The plain pass runs SDPA's
causal path; Self-Extend and sinks attend in query blocks over the band that needs both rotations
(studies.grouped_attention); the head and the loss run 1,024 tokens at a time
(runtime.evaluate.token_losses). Each row is its own child process: the model is loaded and its
RSS noted, the kernel's peak mark reset (`/proc/self/clear_refs`, 5), then one pass of
studies.context_extension.method_losses, exactly as `rope eval` runs it, with the allocator the
command line sets (fast.malloc: large buffers kept, so the peak includes what glibc holds, and
the blocked methods reuse each block's score buffer instead of faulting it in again); the row
gives the time, the peak RSS above the loaded model and the process's whole peak.
--quick: the llama-2024-small preset (random weights) at 256..1024 tokens.
"""

from __future__ import annotations

import torch

from benchmarks.common import Section, run_child

NAME = "long_loss"
CLAIM = "the loss of every token of 32,768 tokens through SmolLM2-135M in under 4 GB on a CPU (no T x T scores, " \
        "no T x V logits), for the plain pass and for Self-Extend's and sinks' query blocks"
TARGET_GIB = 4.0

CHILD = r"""
import json, sys, time, torch
from llamablock.studies.context_extension import method_losses

def status_kib(field):
    for line in open("/proc/self/status"):
        if line.startswith(field + ":"):
            return int(line.split()[1])

from llamablock.fast.kernels.malloc import tune_allocator
quick, method, t, threads = sys.argv[1] == "quick", sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
tune_allocator()  # as the command line sets it: the blocked methods' score buffers are reused, not refaulted
torch.set_num_threads(threads)
torch.manual_seed(0)
if quick:
    from dataclasses import replace
    from llamablock.model import Decoder
    from llamablock.presets import preset
    model = Decoder(replace(preset("llama-2024-small"), max_seq_len=t // 2)).eval()
else:
    import llamablock
    model = llamablock.load_pretrained(None, torch.float32)
ids = torch.randint(0, model.cfg.vocab_size, (1, t))
with torch.no_grad():
    method_losses(model, ids[:, :64], method, t / model.cfg.max_seq_len)  # the kernels warmed up
    before = status_kib("VmRSS")
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # the peak (VmHWM) reset to the current RSS: loading's own peak is not counted
    t0 = time.perf_counter()
    method_losses(model, ids, method, t / model.cfg.max_seq_len)
    seconds = time.perf_counter() - t0
c = model.cfg
print(json.dumps({"seconds": seconds, "grew_kib": status_kib("VmHWM") - before, "peak_kib": status_kib("VmHWM"),
                  "heads": c.n_heads, "vocab": c.vocab_size, "trained": c.max_seq_len}))
"""


def run(quick: bool = False) -> list[Section]:
    threads = torch.get_num_threads()
    rows = ([("none", n) for n in (256, 512, 1024)] + [("self-extend", 1024), ("sinks", 1024)] if quick else
            [("none", 8192), ("none", 16384), ("none", 32768), ("self-extend", 16384), ("sinks", 16384)])
    model = "llama-2024-small (random)" if quick else "SmolLM2-135M-Instruct float32"
    sec = Section(f"One pass of `rope eval` (studies.context_extension.method_losses), {model}, {threads} thread(s)",
                  ["method", "tokens", "seconds", "tokens/s", "peak RSS above the model MiB", "process peak MiB",
                   "one layer's T x T scores MiB (not allocated)", "T x V logits MiB (not allocated)"])
    got = {}
    for method, n in rows:
        r = got[method, n] = run_child(CHILD, "quick" if quick else "full", method, str(n), str(threads))
        sec.rows.append([method, str(n), f"{r['seconds']:.1f}", f"{n / r['seconds']:.0f}", f"{r['grew_kib'] / 1024:.0f}",
                         f"{r['peak_kib'] / 1024:.0f}", f"{r['heads'] * n * n * 4 / 2**20:,.0f}",
                         f"{n * r['vocab'] * 4 / 2**20:,.0f}"])
    longest = max(n for m, n in rows if m == "none")
    peak = got["none", longest]["peak_kib"] / 2**20
    sec.notes.append(f"Trained context L = {got['none', longest]['trained']:,}; each method's factor is tokens / L. "
                     f"Self-Extend uses rope eval's default group and window, sinks four sink tokens and a window of "
                     f"L - 4.")
    if not quick:
        sec.notes.append(f"Target: the whole process under {TARGET_GIB:g} GiB at {longest:,} tokens: "
                         f"{'met' if peak < TARGET_GIB else 'MISSED'} ({peak:.2f} GiB).")
    return [sec]

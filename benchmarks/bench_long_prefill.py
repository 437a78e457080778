"""Prefill of long prompts: time and peak memory against length (module section 15.5).

Naive attention materializes a T x T score matrix per head: for SmolLM2-135M (9 query heads)
at 8,192 tokens that is 9 x 8192^2 x 4 bytes = 2.4 GB per layer in float32. llamablock's prefill
calls scaled_dot_product_attention with is_causal=True, whose CPU kernel works block by block
(flash-attention style), so the extra memory should grow linearly with T: activations of
(T, d) and (T, d_ff) and the KV cache.
Each length runs in its own child process: the model is loaded, its RSS noted and the kernel's
peak-RSS mark reset (`/proc/self/clear_refs`, 5), then one prefill with a fresh KVCache and
`last_only=True`; the row reports the peak RSS above the model's (VmHWM - VmRSS before), and the
time. The children keep glibc's default allocator (no llamablock.fast.kernels.malloc tuning), which returns
large buffers to the system on free, so RSS follows the live tensors instead of memory kept
from loading.
--quick: the llama-2024-small preset (random weights) at 256..1024 tokens.
"""

from __future__ import annotations

from benchmarks.common import Section, run_child

NAME = "long_prefill"
CLAIM = "prefill of 8,192 tokens with peak memory linear in length (no T x T score matrix)"

CHILD = r"""
import json, sys, time, torch
from llamablock.kv_cache import KVCache

def status_kib(field):
    for line in open("/proc/self/status"):
        if line.startswith(field + ":"):
            return int(line.split()[1])

quick, t = sys.argv[1] == "quick", int(sys.argv[2])
torch.manual_seed(0)
if quick:
    from llamablock.model import Decoder
    from llamablock.presets import preset
    from dataclasses import replace
    model = Decoder(replace(preset("llama-2024-small"), max_seq_len=t)).eval()
else:
    import llamablock
    model = llamablock.load_pretrained(None)
ids = torch.randint(0, model.cfg.vocab_size, (1, t))
with torch.no_grad():
    model(ids[:, :16], cache=KVCache(model.cfg, 1, 16), last_only=True)  # warm the kernels up
    before = status_kib("VmRSS")
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # reset the peak (VmHWM) to the current RSS: loading's own peak is not counted
    t0 = time.perf_counter()
    model(ids, cache=KVCache(model.cfg, 1, t), last_only=True)
    seconds = time.perf_counter() - t0
after = status_kib("VmHWM")
c = model.cfg
print(json.dumps({"seconds": seconds, "grew_kib": after - before, "heads": c.n_heads, "layers": c.n_layers,
                  "kv_bytes": 2 * c.n_layers * c.n_kv_heads * c.head_dim * t * 4}))
"""


def _child(quick: bool, tokens: int) -> dict:
    return run_child(CHILD, "quick" if quick else "full", str(tokens))


def run(quick: bool = False) -> list[Section]:
    lengths = (256, 512, 1024) if quick else (1024, 2048, 4096, 8192)
    got = {t: _child(quick, t) for t in lengths}
    model = "llama-2024-small (random)" if quick else "SmolLM2-135M float32"
    sec = Section(f"Prefill of one prompt, {model}, fresh KV cache, logits of the last position",
                  ["tokens", "seconds", "tokens/s", "peak RSS growth MiB", "growth / token KiB",
                   "KV cache MiB", "one layer's T x T scores MiB (not allocated)"])
    for t, r in got.items():
        scores = r["heads"] * t * t * 4 / 2**20
        sec.rows.append([str(t), f"{r['seconds']:.2f}", f"{t / r['seconds']:.0f}", f"{r['grew_kib'] / 1024:.0f}",
                         f"{r['grew_kib'] / t:.1f}", f"{r['kv_bytes'] / 2**20:.0f}", f"{scores:.0f}"])
    first, last = lengths[0], lengths[-1]
    growth = got[last]["grew_kib"] / max(got[first]["grew_kib"], 1)
    sec.notes.append(f"From {first} to {last} tokens ({last // first}x) the peak memory above the model grew "
                     f"{growth:.1f}x; with a materialized T x T score matrix it would grow towards {(last // first) ** 2}x.")
    return [sec]

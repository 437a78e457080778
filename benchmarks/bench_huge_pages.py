"""The compiled decode step with its weights in 2 MiB pages against 4 KiB pages (llamablock.fast.compiled.huge_pages).

Per format, a child process (with the command line's allocator settings, llamablock.fast.kernels.malloc)
builds two AOTIEngine engines from the same model: the first compiles the AOTInductor
package (or loads it from the cache) and keeps its weights in the 4 KiB pages they were loaded
into, the second loads the same package and moves its weights into 2 MiB pages. Both run the
same library. Both prefill the same prompt, then decode blocks of `steps` greedy steps from the
same position, the two engines alternating block by block (llamablock.util.timing.time_calls);
the logits of a prefill and a step are checked equal first.
Why a child each: memory once moved into 2 MiB pages keeps asking for them after it is freed
(the mark is on the address range, and glibc reuses freed ranges), so an engine built in a
process that had moved weights before may get huge pages without asking. Measured: run in the
decode benchmark's process, the "4 KiB" engines ran as fast as the others (0.94-1.00x). The child
reports the process's huge pages before the move (AnonHugePages; near 0 means the 4 KiB engine
really has small pages).
Full: SmolLM2-135M in float32, bfloat16, q8 and q4, autotuned as `generate --compile`, and its
file's own blocks (format blocks, what the default compiles).
--quick: a random one-layer model with a 16,384-token vocabulary (16 MiB of float32 weights),
float32, no autotuning.
"""

from __future__ import annotations

from benchmarks.common import Section, run_child

NAME = "huge_pages"
CLAIM = "the compiled step's weights in 2 MiB pages: decode tokens/s against 4 KiB pages"

CHILD = r"""
import json, sys, torch
from llamablock.fast.compiled.compile_cache import use_persistent_cache
from llamablock.fast.kernels.malloc import tune_allocator
tune_allocator(); use_persistent_cache()
from llamablock.fast.compiled.aoti_engine import AOTIEngine
from llamablock.fast.compiled.huge_pages import huge_bytes
from llamablock.util.timing import time_calls
fmt, quick, prompt, steps, repeats = sys.argv[1], sys.argv[2] == "quick", *map(int, sys.argv[3:6])
if quick:
    from llamablock.config import ModelConfig
    from llamablock.model import Decoder
    cfg = ModelConfig(vocab_size=16384, d_model=128, n_layers=1, n_heads=4, n_kv_heads=2, max_seq_len=256)
    model = Decoder(cfg).eval()
elif fmt == "blocks":  # the file's own blocks, as the default compiles a Q4_1 file
    from llamablock.fast.plan import load_gguf_native
    from llamablock.io.resolve import resolve_model
    model = load_gguf_native(resolve_model(None), engine="compiled")[0].eval()  # its blocks call the operator
else:
    import llamablock
    model = llamablock.load_pretrained(None, torch.float32 if fmt == "float32" else torch.bfloat16).eval()
engines = {}
with torch.no_grad():
    for huge in (False, True):
        if huge:
            before = huge_bytes()
        engine = AOTIEngine(model, fmt, autotune=not quick, compile_prefill=not quick, huge_pages=huge)
        engine.prepare(prompt + steps + 1)
        engines[huge] = engine
    ids = torch.randint(0, model.cfg.vocab_size, (1, prompt), generator=torch.Generator().manual_seed(0))
    token = torch.tensor([[1]])
    logits = [e.prefill(ids) for e in engines.values()] + [e.step(token, prompt) for e in engines.values()]
    if not (torch.equal(logits[0], logits[1]) and torch.equal(logits[2], logits[3])):
        raise SystemExit(f"{fmt}: the same library gave other logits with its weights in huge pages")
    block = lambda e: (lambda: [e.step(token, prompt + i) for i in range(steps)])
    t = time_calls({"small": block(engines[False]), "huge": block(engines[True])}, repeats=repeats, warmup=1)
print(json.dumps({"before": before, "moved": engines[True]._step_program.huge_page_bytes,
                  "small": steps / t["small"]["median"], "huge": steps / t["huge"]["median"]}))
"""


def _child(fmt: str, quick: bool, prompt: int, steps: int, repeats: int) -> dict:
    args = [fmt, "quick" if quick else "full", str(prompt), str(steps), str(repeats)]
    return run_child(CHILD, *args)


def run(quick: bool = False) -> list[Section]:
    prompt, steps, repeats = (16, 8, 3) if quick else (64, 32, 8)
    what = "a random 1-layer model (16 MiB), float32" if quick else "SmolLM2-135M"
    sec = Section(f"Compiled decode step, {what}: weights in 4 KiB pages against 2 MiB pages "
                  f"(blocks of {steps} steps, medians of {repeats}, alternating; a child process per format)",
                  ["format", "MiB in 2 MiB pages before the move", "MiB moved", "tokens/s, 4 KiB pages",
                   "tokens/s, 2 MiB pages", "ratio"])
    for fmt in ("float32",) if quick else ("float32", "bfloat16", "q8", "q4", "blocks"):
        r = _child(fmt, quick, prompt, steps, repeats)
        sec.rows.append([fmt, f"{r['before'] / 2**20:.0f}", f"{r['moved'] / 2**20:.0f}", f"{r['small']:.1f}",
                         f"{r['huge']:.1f}", f"{r['huge'] / r['small']:.2f}x"])
    sec.notes.append("Both engines run one AOTInductor library; the logits of a prefill and a step are equal bit "
                     "for bit. 'MiB moved' is what the kernel moved into 2 MiB pages (MADV_COLLAPSE); 0 means it "
                     "refused, and the two then differ by noise only. The two alternate in one process, so each "
                     "reads its weights after the other has evicted them from the caches, as in the decode "
                     "table's rounds.")
    return [sec]

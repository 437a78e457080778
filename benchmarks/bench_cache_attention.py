"""An eager decode step over a 16-bit KV cache, the cache read in place against read upcast, by context length.

The eager engine keeps a quantized model's KV cache in the CPU's 16-bit type (fast/plan.py kv_dtype).
llamablock.attention reads it upcast to float32, a copy of every filled slot of every layer at every
step; fast/kernels/cache_attention.py reads it in place (c/cache_attention.c), what the plan gives the
eager engine's torch step where the kernel built (over a GGUF's blocks the plan's steps run in C instead,
fast/decode_step.py, reading the cache with the same C; `bench size` times them). The model as
`llamablock generate` plans it, its torch step (EagerEngine); at each
position P it prefills P random tokens, then the two readings alternate (llamablock.util.timing), each
a block of STEPS greedy steps from P (the cache's length set back to P before each block, so both
decode the same slots). The logits of one step are compared (float32 rounding apart, not bit for bit:
the sums run in another order). Models: the embedded SmolLM2-135M (Q4_1) and, full runs only, the
1B Q4_0 file `bench size` writes (Llama-3.2-1B's shape; written once into the user's cache). Full runs
also time SmolLM2's compiled step (two AOTInductor builds, minutes each): its cache read by products
and sums over keys.float() against in place, through the operators (fast/kernels/block_op.cpp).
--quick: SmolLM2's eager step at two short positions.
"""

from __future__ import annotations

import torch

from benchmarks.common import Section

NAME = "cache_attention"
CLAIM = ("an eager decode step reads a 16-bit KV cache in place (the kernel's attention) instead of upcasting "
         "every filled slot: step time against the upcast reading, by context length")
STEPS = 4


def _engine(path):
    from llamablock.fast.plan import build, decide
    from llamablock.io.source import open_source
    from llamablock.runtime.engine import EagerEngine

    source = open_source(path, tokenizer=False)
    plan = decide(source, "auto", "eager")
    built = build(source, plan)  # its engine steps in C over these files' blocks: the torch step's reader is timed
    return EagerEngine(built.model, kv_dtype=built.engine.kv_dtype), plan


def _rows(label: str, path, positions: list[int], repeats: int) -> list[list[str]]:
    from llamablock.attention import Attention
    from llamablock.util.denormals import flushed_denormals
    from llamablock.util.timing import time_calls

    engine, plan = _engine(path)
    layers = [m for m in engine.model.modules() if isinstance(m, Attention)]
    reader = layers[0].cache_reader
    if reader is None:
        raise RuntimeError(f"the plan gives {label} no cache reader (KV cache {plan.kv}; kernel built?)")
    ids = torch.randint(0, engine.cfg.vocab_size, (1, max(positions) + STEPS),
                        generator=torch.Generator().manual_seed(0))
    rows = []
    with torch.inference_mode(), flushed_denormals():
        for pos in positions:
            engine.prepare(pos + STEPS + 1)
            engine.prefill(ids[:, :pos])

            def block(use, pos=pos):
                def run():
                    for layer in layers:
                        layer.cache_reader = reader if use else None
                    engine.cache.length = pos  # both readings decode slots pos .. pos + STEPS - 1
                    return [engine.step(ids[:, p:p + 1], p) for p in range(pos, pos + STEPS)]
                return run

            got, want = block(True)()[-1], block(False)()[-1]
            diff = (got - want).abs().max().item() / want.abs().max().item()
            t = time_calls({"in place": block(True), "upcast": block(False)}, repeats=repeats, warmup=1)
            a, b = t["in place"]["median"] / STEPS, t["upcast"]["median"] / STEPS
            rows.append([label, str(pos), plan.kv, f"{b * 1e3:.1f}", f"{a * 1e3:.1f}", f"{b / a:.2f}x", f"{diff:.1e}"])
        for layer in layers:
            layer.cache_reader = reader
    return rows


def _compiled_rows(label: str, path, positions: list[int], repeats: int) -> list[list[str]]:
    """The compiled step (AOTInductor over the file's blocks, no autotuning) with its cache read by
    products and sums over keys.float() against the operators (StaticEngine.in_place): two programs."""
    from llamablock.fast.compiled.aoti_engine import AOTIEngine
    from llamablock.fast.plan import decide, load_gguf_native
    from llamablock.io.source import open_source
    from llamablock.util.denormals import flushed_denormals
    from llamablock.util.timing import time_calls

    kv = getattr(torch, decide(open_source(path, tokenizer=False), "auto", "compiled").kv)
    model = load_gguf_native(path, engine="compiled")[0].eval()
    engines = {}
    for in_place in (False, True):
        engine = AOTIEngine(model, "blocks", autotune=False, kv_dtype=kv)
        engine.in_place = in_place  # before its programs are built: another package each
        engine.prepare(max(positions) + STEPS + 1)
        engines["in place" if in_place else "sums"] = engine
    ids = torch.randint(0, model.cfg.vocab_size, (1, max(positions) + STEPS),
                        generator=torch.Generator().manual_seed(0))
    rows = []
    with torch.inference_mode(), flushed_denormals():
        for pos in positions:
            for engine in engines.values():
                engine.prefill(ids[:, :pos])
            block = {name: (lambda e=e, pos=pos: [e.step(ids[:, p:p + 1], p) for p in range(pos, pos + STEPS)][-1])
                     for name, e in engines.items()}
            got, want = block["in place"](), block["sums"]()
            diff = (got - want).abs().max().item() / want.abs().max().item()
            t = time_calls(block, repeats=repeats, warmup=1)
            a, b = t["in place"]["median"] / STEPS, t["sums"]["median"] / STEPS
            rows.append([label, str(pos), str(kv).removeprefix("torch."), f"{b * 1e3:.1f}", f"{a * 1e3:.1f}",
                         f"{b / a:.2f}x", f"{diff:.1e}"])
    return rows


def run(quick: bool = False) -> list[Section]:
    from llamablock.io.resolve import resolve_model

    repeats = 3 if quick else 8
    sec = Section(f"Eager decode step at position P, ms (medians of {repeats} interleaved blocks of {STEPS} steps, "
                  f"{torch.get_num_threads()} thread(s))",
                  ["model", "P", "KV cache", "upcast", "in place", "speed-up", "largest logit difference, relative"])
    sec.rows += _rows("SmolLM2-135M Q4_1", resolve_model(None), [64, 256] if quick else [64, 1024, 4096], repeats)
    if not quick:
        from benchmarks.bench_size import SHAPE, files

        sec.rows += _rows("1B Q4_0 (bench size's file)", files(["Q4_0"], SHAPE)["Q4_0"], [64, 1024, 4096], repeats)
    sections = [sec]
    if not quick:  # two AOTInductor builds of SmolLM2 (minutes each)
        comp = Section(f"Compiled decode step (AOTInductor over the file's blocks, no autotuning) at position P, ms "
                       f"(medians of {repeats} interleaved blocks of {STEPS} steps)",
                       ["model", "P", "KV cache", "products and sums", "in place", "speed-up",
                        "largest logit difference, relative"])
        comp.rows += _compiled_rows("SmolLM2-135M Q4_1", resolve_model(None), [64, 1024, 4096], repeats)
        comp.notes.append("Products and sums over keys.float() are what inductor compiles from torch ops; in place, "
                          "the step calls llamablock::cache_attention (block_op.cpp), the eager reader's C and "
                          "softmax, one call a layer.")
        sections.append(comp)
    sec.notes.append("The upcast reading copies each layer's filled keys and values to float32 before two batched "
                     "matmuls; in place, each key and value is converted as it is read. The logits differ by "
                     "float32 rounding (the two sum in other orders), grown through the layers, whose block kernel "
                     "rounds each layer's input to 16 bits.")
    return sections

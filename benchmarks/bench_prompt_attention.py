"""A prompt's causal attention in chunks of grouped queries against torch's SDPA, by length and head shape.

fast/kernels/prompt_attention.py gives the eager engine's attention layers a reader that computes a causal
prefill in chunks of CHUNK queries, the g query heads of a group stacked into one matmul against the
keys up to the chunk's end; it takes prompts of FROM to UP_TO tokens, read off the first table here.
Three tables: attention alone, the two interleaved in this process (llamablock.util.timing), random
float32 q, k, v of real models' head shapes, medians and minima; the chunk's size at 512 tokens; and,
full runs only, the whole eager prefill of 512 tokens (the plan's engine, the readers on and off
between rounds) of the embedded SmolLM2-135M and the 1B Q4_K_M file `bench size` writes (`bench
size`'s step profile says how much of each prefill is attention).
--quick: two shapes at two lengths, no whole prefill.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from benchmarks.common import Section, ms
from llamablock.fast.kernels import prompt_attention
from llamablock.util.timing import time_calls

NAME = "prompt_attention"
CLAIM = ("a prompt's causal attention in chunks of grouped queries (the eager engine's prefill) against torch's "
         "scaled_dot_product_attention: where the chunks' range of prompt lengths comes from")
# (query heads, kv heads, head width): the models whose shapes these are
SHAPES = {"Llama-3.2-1B (32, 8, 64)": (32, 8, 64), "SmolLM2-135M (9, 3, 64)": (9, 3, 64),
          "Llama-3.2-3B (24, 8, 128)": (24, 8, 128), "Qwen2.5-0.5B (14, 2, 64)": (14, 2, 64),
          "Llama-2-7B, MHA (32, 32, 128)": (32, 32, 128)}


def _pair(h: int, n_kv: int, hd: int, t: int, repeats: int) -> tuple[dict, dict]:
    gen = torch.Generator().manual_seed(0)
    q, k, v = torch.randn(1, h, t, hd, generator=gen), *(torch.randn(1, n_kv, t, hd, generator=gen) for _ in range(2))
    scale = hd**-0.5
    t = time_calls({"sdpa": lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=n_kv != h),
                    "chunks": lambda: prompt_attention.chunked_causal(q, k, v, scale)}, repeats=repeats, warmup=1)
    return t["sdpa"], t["chunks"]


def _prefill_rows(label: str, path, repeats: int) -> list[str]:
    from llamablock.attention import Attention
    from llamablock.fast.plan import build, decide
    from llamablock.io.source import open_source
    from llamablock.util.denormals import flushed_denormals

    source = open_source(path, tokenizer=False)
    engine = build(source, decide(source, "auto", "eager")).engine
    layers = [m for m in engine.model.modules() if isinstance(m, Attention)]
    reader = layers[0].prompt_reader
    ids = torch.randint(0, source.cfg.vocab_size, (1, 512), generator=torch.Generator().manual_seed(0))

    def prefill(use):
        def run():
            for m in layers:
                m.prompt_reader = reader if use else None
            engine.prepare(ids.shape[1] + 1)
            return engine.prefill(ids)
        return run

    with torch.inference_mode(), flushed_denormals():
        t = time_calls({"sdpa": prefill(False), "chunks": prefill(True)}, repeats=repeats, warmup=1)
    for m in layers:
        m.prompt_reader = reader
    a, b = t["sdpa"]["median"], t["chunks"]["median"]
    return [label, f"{a * 1e3:.0f}", f"{b * 1e3:.0f}", f"{a / b:.2f}x"]


@torch.inference_mode()
def run(quick: bool = False) -> list[Section]:
    from llamablock.io.resolve import resolve_model

    repeats = 3 if quick else 9
    shapes = dict(list(SHAPES.items())[:2]) if quick else SHAPES
    lengths = (256, 512) if quick else (128, 256, 512, 1024, 2048)
    threads = torch.get_num_threads()
    alone = Section(f"Causal attention of a t-token prompt, float32, ms (medians of {repeats} interleaved calls, "
                    f"minima in brackets), {threads} thread(s); chunks of {prompt_attention.CHUNK} queries",
                    ["shape (query heads, kv heads, width)", "t", "SDPA", "chunks", "SDPA / chunks"])
    for name, (h, n_kv, hd) in shapes.items():
        for t in lengths:
            a, b = _pair(h, n_kv, hd, t, repeats)
            alone.rows.append([name, str(t), f"{ms(a['median'])} ({ms(a['min'])})", f"{ms(b['median'])} ({ms(b['min'])})",
                               f"{a['median'] / b['median']:.2f}x"])
    alone.notes.append(f"The eager engine takes the chunks for prompts of {prompt_attention.FROM} to "
                       f"{prompt_attention.UP_TO} tokens (fast/kernels/prompt_attention.py FROM, UP_TO); SDPA is torch's "
                       "CPU flash kernel, one query head at a time, which splits a long prompt's keys too.")
    chunk = Section(f"The chunk's size, Llama-3.2-1B's heads at 512 tokens, ms (medians of {repeats})",
                    ["CHUNK", "SDPA", "chunks", "SDPA / chunks"])
    kept = prompt_attention.CHUNK
    try:
        for size in (16, 32, 64, 128):
            prompt_attention.CHUNK = size
            a, b = _pair(32, 8, 64, 512, repeats)
            chunk.rows.append([str(size), ms(a["median"]), ms(b["median"]), f"{a['median'] / b['median']:.2f}x"])
    finally:
        prompt_attention.CHUNK = kept
    sections = [alone, chunk]
    if not quick:
        from benchmarks.bench_size import SHAPE, files

        whole = Section(f"The eager engine's prefill of 512 tokens, ms (medians of 5 interleaved prefills), {threads} "
                        f"thread(s)", ["file", "SDPA", "chunks", "SDPA / chunks"])
        whole.rows.append(_prefill_rows("SmolLM2-135M Q4_1 (embedded)", resolve_model(None), 5))
        whole.rows.append(_prefill_rows("1B Q4_K_M (bench size's file)", files(["Q4_K_M"], SHAPE)["Q4_K_M"], 5))
        sections.append(whole)
    return sections

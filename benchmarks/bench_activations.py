"""The block kernel's activations in 8 bits against its 16: the prefill speed it buys and the accuracy it costs.

Every engine quantizes x to 16 bits per block of 32 before the integer products (c/blocks.h);
llama.cpp quantizes to 8 (q8_0). In 8 bits the grouped x86 kernels skip half their byte products
(c/x86_super.h, c/x86.c group_sums_q8_eight), which is what a prefill, bound by those products,
waits on. This measures both sides of that trade on the CPU at hand: the grouped kernel's ms per
call at a decode row and at prefill rows, 16 against 8 bits, interleaved on one thread, for the
types a 1B download holds (Q4_0, Q8_0, Q4_K, Q6_K; a 2048 x 2048 layer, Llama-3.2-1B's attention
width), and the embedded SmolLM2-135M's perplexity on Macbeth against its exact weights in
float32 (runtime.evaluate.compare_to_reference, as `llamablock perplexity --compare float32`) with
its layers' activations in each. The issue's bound for the default is a perplexity within 0.1%
of the exact weights': the verdict line says whether 8 bits keeps it, which decides the default.
--quick: Q4_0 only, 1 and 64 rows, 3 rounds, 256 tokens.
"""

from __future__ import annotations

import functools

import numpy as np
import torch

from benchmarks.common import Section

NAME = "activations"
CLAIM = ("8-bit activations (llama.cpp's) against the block kernel's 16: prefill speed bought, perplexity against "
         "the exact weights lost; the default keeps 16 unless 8 stays within 0.1%")
PER_CPU_KIND = True  # the grouped kernels' 8-bit savings are the AVX2 code's (the AVX-512 Q4_0/Q8_0 kernels skip nothing)
TARGET = 1.001  # the issue's perplexity bound for the default: within 0.1% of the exact weights'


def _blocks(type_name: str, n: int, k: int) -> torch.Tensor:
    """(n, k) weights in `type_name`'s blocks: gguf's quantizer for Q4_0 and Q8_0; random bytes with a
    float16 d (and dmin) of 0.01 for the K types, which gguf cannot quantize."""
    import gguf

    qtype = gguf.GGMLQuantizationType[type_name]
    if type_name in ("Q4_0", "Q8_0"):
        w = torch.randn(n, k, generator=torch.Generator().manual_seed(0)) * 0.02
        return torch.from_numpy(gguf.quantize(w.numpy(), qtype)).view(torch.uint8).reshape(n, -1)
    weights, size = gguf.GGML_QUANT_SIZES[qtype]
    raw = np.random.default_rng(0).integers(0, 256, size=(n, k // weights, size), dtype=np.uint8)
    scale = np.full(raw.shape[:2], 0.01, dtype=np.float16).view(np.uint8).reshape(*raw.shape[:2], 2)
    for at in ((208,) if type_name == "Q6_K" else (0, 2)):
        raw[..., at:at + 2] = scale
    return torch.from_numpy(raw.reshape(n, -1))


def _speed(quick: bool) -> Section:
    from llamablock.fast.kernels import ggml_kernel
    from llamablock.fast.kernels.file_blocks import group_rows
    from llamablock.util.cpu import this_cpu
    from llamablock.util.timing import time_calls

    types = ("Q4_0",) if quick else ("Q4_0", "Q8_0", "Q4_K", "Q6_K")
    rows = (1, 64) if quick else (1, 64, 256)
    repeats = 3 if quick else 9
    n = k = 2048
    sec = Section(f"The grouped block kernel, {n} x {k} layer, ms per call with x in 16 bits / 8 bits and their ratio "
                  f"(medians of {repeats} interleaved rounds, one thread); CPU kind {this_cpu().kind}",
                  ["type", *[f"{m} rows" for m in rows]])
    threads, largest = torch.get_num_threads(), 0
    torch.set_num_threads(1)
    try:
        for type_name in types:
            blocks = group_rows(type_name, _blocks(type_name, n, k))
            largest = max(largest, blocks.numel())
            cells = []
            for m in rows:
                x = torch.randn(m, k, generator=torch.Generator().manual_seed(1))
                t = time_calls({bits: functools.partial(ggml_kernel.matmul, type_name, blocks, x, threads=1,
                                                        grouped=True, bits=bits) for bits in (16, 8)},
                               repeats, warmup=1)
                a, b = t[16]["median"] * 1e3, t[8]["median"] * 1e3
                cells.append(f"{a:.2f} / {b:.2f} ({a / b:.2f}x)")
            sec.rows.append([type_name, *cells])
    finally:
        torch.set_num_threads(threads)
    sec.notes.append(f"One row is a decode step's call: these layers (at most {largest / 2**20:.1f} MiB) stay "
                     "in the last-level cache, so the row times the arithmetic, where a 1B step reads its weights from "
                     "memory; from 64 rows (a prefill) the byte products bound the call wherever the weights are.")
    return sec


def _accuracy(quick: bool) -> Section:
    from llamablock.fast.kernels import ggml_kernel
    from llamablock.fast.kernels.file_blocks import BlockLinear
    from llamablock.fast.plan import load_in_format
    from llamablock.io.source import open_source
    from llamablock.runtime.evaluate import compare_to_reference
    from llamablock.training.data import play_to_text, plays_dir

    tokens = 256 if quick else 2048
    context = min(512, tokens // 2)
    source = open_source(None)
    exact, _ = load_in_format(source, "float32")
    model, what = load_in_format(source, "blocks")
    layers = [m for m in model.modules() if isinstance(m, BlockLinear)]
    play = next(plays_dir().glob("*/macbeth.md")).read_text(encoding="utf-8")
    ids = source.tokenizer.encode(play_to_text(play))[:tokens]
    sec = Section(f"SmolLM2-135M-Instruct ({what}) against its exact weights in float32: the first {tokens} tokens of "
                  f"Macbeth, windows of {context} advancing by {context // 2}, {torch.get_num_threads()} thread(s)",
                  ["activations", "perplexity", "float32 perplexity", "ratio", "mean KL (nats)", "top-1 agreement"])
    ratios = {}
    for bits in (16, 8):
        for m in layers:
            m.binding = functools.partial(ggml_kernel.matmul, bits=bits)
        r = compare_to_reference(model, exact, ids, context, context // 2)
        ratios[bits] = r["perplexity_ratio"]
        sec.rows.append([f"{bits} bits" + (" (every engine's)" if bits == 16 else " (llama.cpp's)"),
                         f"{r['perplexity']:.4f}", f"{r['reference_perplexity']:.4f}", f"{r['perplexity_ratio']:.5f}",
                         f"{r['mean_kl']:.2e}", f"{100 * r['top1_agreement']:.2f}%"])
    for bits, ratio in ratios.items():
        verdict = "within" if abs(ratio - 1) <= TARGET - 1 else "outside"
        sec.notes.append(f"{bits} bits: perplexity {abs(ratio - 1):.2%} from the exact weights', {verdict} the "
                         f"{TARGET - 1:.1%} the default must keep.")
    keeps = abs(ratios[8] - 1) <= TARGET - 1
    sec.notes.append("So 8 bits could be the default here: the speed above at that cost." if keeps else
                     "So the default stays 16 bits, and the prefill target at 1B stays missed by the kernel's "
                     "products (bench size): 8-bit activations would buy the speed above only at this cost.")
    return sec


def run(quick: bool = False) -> list[Section]:
    return [_speed(quick), _accuracy(quick)]

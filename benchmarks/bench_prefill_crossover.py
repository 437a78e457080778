"""Prefill through a packed layer: its kernel row by row against dequantizing and the bf16 GEMM.

llamablock.fast.kernels.quant switches a q8/q4 layer from the packed kernel to a dequantized bfloat16 GEMM
at a number of rows chosen per CPU kind (PREFILL_BY_CPU). This measures where the switch pays on
the CPU at hand: for each format and layer shape, the kernel and the dequantize-then-GEMM path on
the same activations at 16 to 256 rows, interleaved round by round on one thread (medians), and the
first row count at which the GEMM path is faster. The shapes are SmolLM2-135M's feed-forward up
and down projections and a 2048 x 2048 layer. The header's CPU kind says which entry of the table
the run speaks for (ATEN_CPU_CAPABILITY=avx2 reproduces the AVX2 kernels on an AVX-512 machine).
--quick: one shape, three row counts, few rounds.
"""

from __future__ import annotations

import torch

from benchmarks.common import Section

NAME = "prefill_crossover"
CLAIM = "the packed kernel against dequantize-then-GEMM by rows of prefill: where fast.quant's switch pays"


def _paths(fmt: str, weight: torch.Tensor):
    from llamablock.fast.kernels.quant import Int4Linear, Int8Linear

    if fmt == "q4":
        lin = Int4Linear(weight)
        return (lambda x: torch.ops.aten._weight_int4pack_mm_for_cpu(x, lin.packed, lin.group_size, lin.scales_zeros),
                lambda x: x @ lin.unpacked().to(torch.bfloat16).T)
    lin = Int8Linear(weight)
    return (lambda x: torch.ops.aten._weight_int8pack_mm(x, lin.qweight, lin.scales),
            lambda x: x @ lin.dequantized().to(torch.bfloat16).T)


def run(quick: bool = False) -> list[Section]:
    from llamablock.fast.kernels.quant import prefill_rows
    from llamablock.util.cpu import this_cpu
    from llamablock.util.timing import time_calls

    shapes = [(1536, 576)] if quick else [(1536, 576), (576, 1536), (2048, 2048)]
    rows = (16, 32, 64) if quick else (16, 32, 64, 128, 256)
    repeats = 3 if quick else 9
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    sec = Section(f"Packed kernel / dequantize + bf16 GEMM, ms per call at each row count (medians of {repeats} "
                  f"interleaved rounds, one thread); CPU kind {this_cpu().kind}",
                  ["format", "layer (out x in)", *[f"{m} rows" for m in rows], "GEMM faster from"])
    try:
        g = torch.Generator().manual_seed(0)
        for fmt in ("q8", "q4"):
            for n, k in shapes:
                kernel, gemm = _paths(fmt, torch.randn(n, k, generator=g))
                cells, first = [], None
                for m in rows:
                    x = torch.randn(m, k, generator=g).to(torch.bfloat16)
                    t = time_calls({"kernel": lambda x=x, f=kernel: f(x), "gemm": lambda x=x, f=gemm: f(x)}, repeats, warmup=1)
                    a, b = t["kernel"]["median"] * 1e3, t["gemm"]["median"] * 1e3
                    cells.append(f"{a:.2f} / {b:.2f}")
                    if first is None and b < a:
                        first = m
                sec.rows.append([fmt, f"{n} x {k}", *cells, f"{first} rows" if first else f"beyond {rows[-1]}"])
            chosen = prefill_rows(fmt, this_cpu().kind)
            sec.notes.append(f"{fmt}: llamablock.fast.kernels.quant switches at "
                             f"{f'{chosen} rows' if chosen else 'no row count (the kernel throughout)'} on this CPU "
                             f"kind (PREFILL_BY_CPU).")
    finally:
        torch.set_num_threads(threads)
    return [sec]

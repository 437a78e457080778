"""Prefill through a packed or a block layer: its kernel against dequantizing for a GEMM.

llamablock.fast.kernels.quant switches a q8/q4 layer from the packed kernel to a dequantized bfloat16 GEMM
at a number of rows chosen per CPU kind (PREFILL_BY_CPU). This measures where the switch pays on
the CPU at hand: for each format and layer shape, the kernel and the dequantize-then-GEMM path on
the same activations at 16 to 256 rows, interleaved round by round on one thread (medians), and the
first row count at which the GEMM path is faster. The shapes are SmolLM2-135M's feed-forward up
and down projections and a 2048 x 2048 layer. The header's CPU kind says which entry of the table
the run speaks for (ATEN_CPU_CAPABILITY=avx2 reproduces the AVX2 kernels on an AVX-512 machine).

The second table does the same for a file's own blocks (fast/kernels/ggml_kernel.py matmul): the
block kernel against its gemm_from path, each tile of weight rows dequantized exactly and one
float32 GEMM (GEMM_FROM_BY_CPU), in the types of the files `bench size` runs, at SmolLM2's
feed-forward up projection and the 1B shape's attention, feed-forward up and down matrices, up to a
512-token prompt. Weights are random blocks (the time does not depend on their values).
--quick: one shape, three row counts, few rounds (one block type).
"""

from __future__ import annotations

import torch

from benchmarks.common import Section

NAME = "prefill_crossover"
CLAIM = ("the packed and the block kernels against dequantize-then-GEMM by rows of prefill: where fast.quant's "
         "and ggml_kernel's switches pay")
PER_CPU_KIND = True  # each CPU kind's entry of the two tables (PREFILL_BY_CPU, GEMM_FROM_BY_CPU) is its own run's


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
        blocks = _blocks_section(quick, repeats)
    finally:
        torch.set_num_threads(threads)
    return [sec, blocks]


def _random_blocks(type_name: str, n: int, k: int, g: torch.Generator) -> torch.Tensor:
    """(n, k / weights * bytes) random bytes whose float16 fields are ordinary small scales."""
    from llamablock.fast.kernels.ggml_kernel import SIZES

    weights, size = SIZES[type_name]
    b = torch.randint(0, 256, (n, k // weights, size), dtype=torch.uint8, generator=g)
    scale = torch.full((n, k // weights, 1), 0.01, dtype=torch.float16).view(torch.uint8)  # (.., 2) bytes
    for at in {"Q4_K": (0, 2), "Q6_K": (208,)}.get(type_name, (0,)):
        b[..., at:at + 2] = scale
    return b.reshape(n, -1)


def _blocks_section(quick: bool, repeats: int) -> Section:
    """Block kernel / dequantize + float32 GEMM (ggml_kernel.matmul without and with gemm_from)."""
    from llamablock.fast.kernels import ggml_kernel
    from llamablock.fast.kernels.file_blocks import group_rows
    from llamablock.util.cpu import this_cpu
    from llamablock.util.timing import time_calls

    shapes = [(1536, 576)] if quick else [(1536, 576), (2048, 2048), (8192, 2048), (2048, 8192)]
    rows = (16, 32, 64) if quick else (16, 32, 64, 128, 256, 512)
    types = ("Q4_0",) if quick else ("Q4_0", "Q4_1", "Q8_0", "Q4_K", "Q6_K")  # the 1B files' and SmolLM2's Q4_1
    grouped = ggml_kernel.groups_rows()
    sec = Section(f"Block kernel / dequantize + float32 GEMM, ms per call at each row count (medians of {repeats} "
                  f"interleaved rounds, one thread; rows {'in groups of 8' if grouped else 'in the file order'}); "
                  f"CPU kind {this_cpu().kind}", ["type", "layer (out x in)", *[f"{m} rows" for m in rows],
                                                  "GEMM faster from"])
    g, firsts, ratios = torch.Generator().manual_seed(1), [], {m: [] for m in rows}
    for type_name in types:
        for n, k in shapes:
            if k % ggml_kernel.SIZES[type_name][0]:  # SmolLM2's 576 is not whole super-blocks of 256
                continue
            w = _random_blocks(type_name, n, k, g)
            w = group_rows(type_name, w) if grouped else w
            cells, first = [], None
            for m in rows:
                x = torch.randn(m, k, generator=g)
                calls = {"kernel": lambda x=x, w=w, t=type_name: ggml_kernel.matmul(t, w, x, 1, grouped=grouped),
                         "gemm": lambda x=x, w=w, t=type_name: ggml_kernel.matmul(t, w, x, 1, grouped=grouped,
                                                                                  gemm_from=1)}
                t = time_calls(calls, repeats, warmup=1)
                a, b = t["kernel"]["median"] * 1e3, t["gemm"]["median"] * 1e3
                cells.append(f"{a:.2f} / {b:.2f}")
                ratios[m].append(b / a)
                if first is None and b < a:
                    first = m
            firsts.append(first)
            sec.rows.append([type_name, f"{n} x {k}", *cells, f"{first} rows" if first else f"beyond {rows[-1]}"])
    chosen = ggml_kernel.gemm_rows(this_cpu().kind)
    every = None if None in firsts else max(firsts)
    at = (f" (there the GEMM takes {min(ratios[chosen]):.2f}-{max(ratios[chosen]):.2f}x the kernel's time, by type "
          f"and shape)" if ratios.get(chosen) else "")
    sec.notes.append(f"blocks: the GEMM is faster for every type and shape here from "
                     f"{f'{every} rows' if every else f'no row count up to {rows[-1]}'}; "
                     f"llamablock.fast.kernels.ggml_kernel switches at "
                     f"{f'{chosen} rows' if chosen else 'no row count (the kernel throughout)'} on this CPU kind "
                     f"(GEMM_FROM_BY_CPU){at}.")
    return sec

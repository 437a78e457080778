"""Experiment (not part of the suite): the decode step through AOTInductor instead of torch.compile.

    python -m benchmarks.experiments.aoti_step FORMAT [--autotune]     FORMAT: float32 bfloat16 q8 q4

Why: the compiled step (llamablock.compiled_decode) spends ~3.8 ms of a ~12 ms q8 step launching
kernels from Python and checking dynamo's guards, and a warm start still re-traces for ~16 s.
AOTInductor compiles the exported step into a shared library with a C++ launcher, and loading the
package takes well under a second.
How: `torch.export` of StaticDecoder.step with the per-layer KV caches as inputs that the step
writes in place (as module buffers they would alias the inputs), then
`torch._inductor.aoti_compile_and_package` with freezing (and, with --autotune, the C++ GEMM
templates, as CompiledDecoder uses). Each step's logits are compared with the eager static
layout stepping through the same positions from the same prefill, then decode speed is timed.
Found on this machine (2026-11-29, torch 2.13.0): float32 agrees to 3e-4; bfloat16 and q8 diverge
after a few steps (max |logit diff| 0.5 at the first step, ~49 by the sixth) although they decode
faster (q8 112 tok/s, bf16 74, against 80-94 and 55-63 with torch.compile). Until that divergence
is understood the library does not use AOTInductor.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import torch
from torch import nn

import llamablock
from llamablock.quant import quantize_model
from llamablock.static_decode import StaticDecoder


class _StepWithCacheInputs(nn.Module):
    """step(ids, pos, k0, v0, k1, v1, ...): the caches are inputs, written in place."""

    def __init__(self, static: StaticDecoder):
        super().__init__()
        self.static = static
        for layer in static.layers:  # unregister the buffers: an input must not alias module state
            layer.k_cache, layer.v_cache = layer._buffers.pop("k_cache"), layer._buffers.pop("v_cache")

    def forward(self, ids, pos, *caches):
        for i, layer in enumerate(self.static.layers):
            layer.k_cache, layer.v_cache = caches[2 * i], caches[2 * i + 1]
        return self.static.step(ids, pos)


def _static(model, fmt: str, length: int) -> StaticDecoder:
    s = StaticDecoder(model, length)
    return quantize_model(s, fmt) if fmt in ("q8", "q4") else s


@torch.no_grad()
def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("format", choices=["float32", "bfloat16", "q8", "q4"])
    ap.add_argument("--autotune", action="store_true", help="max-autotune with the C++ GEMM templates")
    args = ap.parse_args()
    model = llamablock.load_pretrained(None, torch.float32 if args.format == "float32" else torch.bfloat16)
    static, reference = _static(model, args.format, 256), _static(model, args.format, 256)
    caches = [c for layer in static.layers for c in (layer.k_cache, layer.v_cache)]
    prompt, tok = torch.tensor([[3, 4, 5, 6]]), torch.tensor([[7]])
    options = {"freezing": True}
    if args.autotune:
        options.update({"max_autotune": True, "max_autotune_gemm_backends": "CPP"})
    with tempfile.TemporaryDirectory() as d:
        t = time.perf_counter()
        program = torch.export.export(_StepWithCacheInputs(static), (tok, torch.tensor([4]), *caches), strict=False)
        package = torch._inductor.aoti_compile_and_package(program, package_path=str(Path(d) / "step.pt2"),
                                                           inductor_configs=options)
        print(f"export + compile: {time.perf_counter() - t:.0f} s")
        t = time.perf_counter()
        runner = torch._inductor.aoti_load_package(package)
        print(f"load: {time.perf_counter() - t:.2f} s")
    static.prefill(prompt)
    reference.prefill(prompt)
    for p in range(4, 10):
        got, want = runner(tok, torch.tensor([p]), *caches), reference.step(tok, torch.tensor([p]))
        print(f"position {p}: max |logit difference| against the eager static layout {(got.float() - want.float()).abs().max():.3g}")
    t, n = time.perf_counter(), 64
    for i in range(n):
        runner(tok, torch.tensor([10 + i]), *caches)
    print(f"decode: {n / (time.perf_counter() - t):.1f} tok/s")


if __name__ == "__main__":
    main()

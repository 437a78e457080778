"""RMSNorm against LayerNorm (module section 15.3: RMSNorm "saves 10-15%" of the norm's time).

Rows of activations (tokens x width) at widths 576 (SmolLM2), 4096 (Llama 2 7B), 8192, float32:
    layernorm         torch.nn.LayerNorm: one ATen kernel (mean, variance, scale, shift)
    rmsnorm eager     llamablock.norm.RMSNorm: five elementwise/reduction ops, each a pass
    rmsnorm compiled  llamablock.fast.compiled.fused.fused_rms_norm: the same maths in one inductor kernel
The ratio column is time / LayerNorm's time (below 1 is faster than LayerNorm).
--quick skips the compiled variant (its first compilation alone takes longer than the test).
"""

from __future__ import annotations

import torch

from benchmarks.common import Section, ms, verdict
from llamablock.fast.compiled.fused import fused_rms_norm
from llamablock.norm import RMSNorm
from llamablock.util.timing import time_calls

NAME = "norm"
CLAIM = "fused RMSNorm at width 4096 at most 0.85x LayerNorm's time"
WIDTHS = (576, 4096, 8192)


@torch.no_grad()
def run(quick: bool = False) -> list[Section]:
    rows, repeats = (64, 3) if quick else (2048, 20)
    sec = Section(f"Norms over ({rows} tokens, width) float32",
                  ["width", "implementation", "min ms", "median ms", "time / LayerNorm"])
    for width in WIDTHS:
        x = torch.randn(rows, width)
        ln, rms = torch.nn.LayerNorm(width), RMSNorm(width)
        fns = {"layernorm": lambda ln=ln, x=x: ln(x), "rmsnorm eager": lambda rms=rms, x=x: rms(x)}
        if not quick:
            torch.testing.assert_close(fused_rms_norm(x, rms.weight, rms.eps), rms(x), atol=1e-5, rtol=1e-5)
            fns["rmsnorm compiled"] = lambda rms=rms, x=x: fused_rms_norm(x, rms.weight, rms.eps)
        t = time_calls(fns, repeats=repeats, warmup=2)
        base = t["layernorm"]["median"]
        if width == 4096 and "rmsnorm compiled" in t:
            sec.notes.append(verdict("compiled RMSNorm / LayerNorm at width 4096", t["rmsnorm compiled"]["median"] / base,
                                     0.85, higher_is_better=False, unit=""))
        for name, r in t.items():
            sec.rows.append([str(width), name, ms(r["min"]), ms(r["median"]), f"{r['median'] / base:.2f}"])
    if quick:
        sec.notes.append("--quick: compiled variant skipped.")
    return [sec]

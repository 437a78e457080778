"""SwiGLU against the 2017 MLP at equal parameters (module section 15.4), and a fused gate/up.

    mlp relu 4d     llamablock.ffn.MLP, d -> 4d -> d (2 matrices, 8 d^2 weights)
    swiglu          llamablock.ffn.GatedFFN, d -> 8d/3 (x2) -> d (3 matrices, ~8 d^2 weights)
    swiglu fused    the same weights with W_gate and W_up concatenated into one matmul
                    (one read of x, one GEMM call; what gpt-fast and llama.cpp do), float32
Decode (1 token) is bound by reading the weights; prefill by arithmetic. Ratio: time / MLP's.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from benchmarks.common import Section, ms
from llamablock.ffn import MLP, GatedFFN, gated_ffn_width
from llamablock.util.timing import time_calls

NAME = "swiglu"
CLAIM = "SwiGLU at equal parameters costs about the same as the 2017 MLP"


@torch.no_grad()
def run(quick: bool = False) -> list[Section]:
    widths = (64,) if quick else (576, 2048)
    tokens = (1, 16) if quick else (1, 512)
    repeats = 3 if quick else 20
    sec = Section("Feed-forward layers, float32", ["d_model", "tokens", "implementation", "min ms", "median ms",
                                                  "time / MLP"])
    for d in widths:
        ff = gated_ffn_width(d, 64 if d < 256 else 256)
        mlp, swi = MLP(d, 4 * d, "relu", bias=False), GatedFFN(d, ff, "swiglu")
        w_gu = torch.cat((swi.w_gate.weight, swi.w_up.weight))  # (2 ff, d)

        def fused(x, w_gu=w_gu, swi=swi, ff=ff):
            gate, up = F.linear(x, w_gu).split(ff, dim=-1)
            return swi.w_down(F.silu(gate) * up)

        for t in tokens:
            x = torch.randn(1, t, d)
            torch.testing.assert_close(fused(x), swi(x), atol=1e-5, rtol=1e-5)
            r = time_calls({"mlp relu 4d": lambda x=x, mlp=mlp: mlp(x), "swiglu": lambda x=x, swi=swi: swi(x),
                            "swiglu fused": lambda x=x, fused=fused: fused(x)},
                           repeats=repeats, warmup=2)
            base = r["mlp relu 4d"]["median"]
            for name, v in r.items():
                sec.rows.append([str(d), str(t), name, ms(v["min"]), ms(v["median"]), f"{v['median'] / base:.2f}"])
    sec.notes.append("d_ff of SwiGLU: 8d/3 rounded up (LLaMA's rule); weights within a few % of the MLP's.")
    return [sec]

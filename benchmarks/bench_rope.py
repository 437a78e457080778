"""Applying RoPE to queries (module section 15.1), per layer of a prefill and of a decode step.

x (1, heads, tokens, head_dim) float32 and cos/sin for those positions:
    llamablock half         llamablock.rope.apply_rope, transformers' rotate_half layout
    llamablock interleaved  the same in Meta's neighbouring-pairs layout
    transformers            transformers' own apply_rotary_pos_emb (Llama), on q and k together,
                            so its time is halved for one tensor's comparison (noted in the row)
    compiled half           llamablock.fast.compiled.fused.fused_apply_rope (one inductor kernel; not in --quick)
The ratio column is time / llamablock half's time.
"""

from __future__ import annotations

import torch

from benchmarks.common import Section, ms
from llamablock.config import ModelConfig
from llamablock.fast.compiled.fused import fused_apply_rope
from llamablock.rope import apply_rope, rope_cos_sin
from llamablock.util.timing import time_calls

NAME = "rope"
CLAIM = "RoPE application cost, eager layouts vs transformers vs a fused kernel"


@torch.no_grad()
def run(quick: bool = False) -> list[Section]:
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    h, d = (4, 32) if quick else (32, 128)
    cases = [("decode", 1), ("prefill", 64 if quick else 2048)]
    repeats = 3 if quick else 20
    sec = Section(f"RoPE on (1, {h} heads, tokens, {d}) float32",
                  ["phase", "tokens", "implementation", "min ms", "median ms", "time / llamablock half"])
    cfg = ModelConfig(vocab_size=8, d_model=h * d, n_layers=1, n_heads=h, n_kv_heads=h, head_dim=d, d_ff=8,
                      max_seq_len=1 << 16)
    for phase, t in cases:
        pos = torch.arange(4096, 4096 + t)[None]  # (1, t)
        cos, sin = rope_cos_sin(cfg, pos, torch.float32)  # (1, t, d/2)
        cos2, sin2 = torch.cat((cos, cos), -1), torch.cat((sin, sin), -1)  # transformers' (1, t, d)
        q = torch.randn(1, h, t, d)
        fns = {"llamablock half": lambda q=q, cos=cos, sin=sin: apply_rope(q, cos, sin, "half"),
               "llamablock interleaved": lambda q=q, cos=cos, sin=sin: apply_rope(q, cos, sin, "interleaved"),
               "transformers (q and k)": lambda q=q, cos2=cos2, sin2=sin2: apply_rotary_pos_emb(q, q, cos2, sin2)}
        if not quick:
            torch.testing.assert_close(fused_apply_rope(q, cos, sin, "half"), apply_rope(q, cos, sin, "half"))
            fns["compiled half"] = lambda q=q, cos=cos, sin=sin: fused_apply_rope(q, cos, sin, "half")
        torch.testing.assert_close(apply_rotary_pos_emb(q, q, cos2, sin2)[0], apply_rope(q, cos, sin, "half"))
        r = time_calls(fns, repeats=repeats, warmup=2)
        base = r["llamablock half"]["median"]
        for name, v in r.items():
            sec.rows.append([phase, str(t), name, ms(v["min"]), ms(v["median"]), f"{v['median'] / base:.2f}"])
    sec.notes.append("transformers rotates q and k in one call; its row is for both tensors.")
    return [sec]

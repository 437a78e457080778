"""One training step of the small presets: tokens/s and model FLOPs utilisation (MFU).

A step is forward, cross-entropy, backward and AdamW on a random batch of the preset's
vocabulary, float32, the two presets interleaved round by round. FLOPs per token follow PaLM's
appendix B: 6 N (N the non-embedding parameters; forward 2N, backward 4N) plus 12 L d_attn T
for attention scores (T the context). MFU = achieved FLOP/s / the peak measured here: a square
float32 matmul, the fastest thing this CPU does (not a datasheet number).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from benchmarks.common import Section, matmul_peak, ms
from llamablock.model import Decoder
from llamablock.presets import preset
from llamablock.util.timing import time_calls

NAME = "train_step"
CLAIM = "training step throughput of the 2017 and 2024 small presets, as MFU of the measured matmul peak"
PRESETS = ("gpt-2017-small", "llama-2024-small")


def flops_per_token(model: Decoder, context: int) -> float:
    cfg = model.cfg
    n = model.num_parameters() - model.embed.weight.numel()  # PaLM: non-embedding parameters
    return 6 * n + 12 * cfg.n_layers * cfg.n_heads * cfg.head_dim * context


def run(quick: bool = False) -> list[Section]:
    batch, context = (2, 32) if quick else (8, 256)
    repeats = 2 if quick else 8
    peak = matmul_peak(256 if quick else 1024, repeats=3 if quick else 8)
    steps, models = {}, {}
    for name in PRESETS:
        torch.manual_seed(0)
        model = Decoder(preset(name))
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
        ids = torch.randint(0, model.cfg.vocab_size, (batch, context + 1))

        def step(model=model, opt=opt, ids=ids):
            logits = model(ids[:, :-1])  # (b, t, V)
            loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1))
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()

        steps[name], models[name] = step, model
    t = time_calls(steps, repeats=repeats, warmup=1)
    tokens = batch * context
    sec = Section(f"Training step, batch {batch} x {context} tokens, float32, AdamW",
                  ["preset", "parameters", "min ms", "median ms", "tokens/s (median)", "MFU"])
    for name, r in t.items():
        m = models[name]
        tps = tokens / r["median"]
        mfu = tps * flops_per_token(m, context) / peak
        sec.rows.append([name, f"{m.num_parameters() / 1e6:.2f} M", ms(r["min"]), ms(r["median"]),
                         f"{tps:,.0f}", f"{100 * mfu:.1f}%"])
    sec.notes.append(f"Peak: {peak / 1e9:.1f} GFLOP/s measured on a float32 square matmul in this run.")
    return [sec]

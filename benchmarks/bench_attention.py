"""Decode attention time against the number of KV heads (module section 15.5: GQA makes
generation "up to 4x faster" going from 32 to 8 KV heads, because a step reads 4x fewer keys).

One query token, 32 query heads of width 128, a cache of 8,192 tokens with 32, 8 or 1 KV
heads, float32 and bfloat16. Two implementations of the same maths:
    grouped  llamablock's `Attention._attend`: the g query heads of a group stacked into one
             (g, d) x (d, s) matmul per KV head, each cached key read once;
    sdpa     torch's scaled_dot_product_attention(enable_gqa=True).
The speed-up columns are time(32 KV heads) / time(this), per implementation and dtype, from
medians and from minima (the minimum is the estimate least disturbed by other processes).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from benchmarks.common import Section, ms, verdict
from llamablock.attention import Attention
from llamablock.config import ModelConfig
from llamablock.lab.timing import time_calls

NAME = "attention"
CLAIM = "GQA decode: 32 -> 8 KV heads at 8,192 tokens at least 3.5x faster (4x is the limit)"
KV_HEADS = (32, 8, 1)


def _attention(n_kv: int, d: int, h: int) -> Attention:
    cfg = ModelConfig(vocab_size=8, d_model=h * d, n_layers=1, n_heads=h, n_kv_heads=n_kv, head_dim=d,
                      d_ff=8, max_seq_len=1 << 16)
    with torch.device("meta"):  # the projections are not used: only _attend is timed
        return Attention(cfg)


@torch.no_grad()
def run(quick: bool = False) -> list[Section]:
    s, d, h = (512, 64, 32) if quick else (8192, 128, 32)
    repeats = 3 if quick else 15
    sec = Section(f"Decode attention, 1 query token, {h} query heads x {d}, {s} cached tokens",
                  ["dtype", "implementation", "KV heads", "min ms", "median ms", "speed-up vs 32 (median)",
                   "speed-up vs 32 (min)"])
    for dtype in (torch.float32, torch.bfloat16):
        fns = {}
        for n_kv in KV_HEADS:
            att = _attention(n_kv, d, h)
            q = torch.randn(1, h, 1, d, dtype=dtype)  # (b, h, t, d)
            k = torch.randn(1, n_kv, s, d, dtype=dtype)  # (b, n_kv, s, d)
            v = torch.randn(1, n_kv, s, d, dtype=dtype)
            fns[("grouped", n_kv)] = lambda att=att, q=q, k=k, v=v: att._attend(q, k, v, s - 1)
            fns[("sdpa", n_kv)] = lambda q=q, k=k, v=v, g=n_kv != h: F.scaled_dot_product_attention(q, k, v, enable_gqa=g)
        # Same answer from both before timing them.
        for n_kv in KV_HEADS:
            a, b = fns[("grouped", n_kv)](), fns[("sdpa", n_kv)]()
            torch.testing.assert_close(a.float(), b.float(), atol=2e-2, rtol=2e-2)
        t = time_calls({f"{i}/{n}": fn for (i, n), fn in fns.items()}, repeats=repeats, warmup=2)
        name = str(dtype).removeprefix("torch.")
        for impl in ("grouped", "sdpa"):
            base = t[f"{impl}/32"]
            for n_kv in KV_HEADS:
                r = t[f"{impl}/{n_kv}"]
                sec.rows.append([name, impl, str(n_kv), ms(r["min"]), ms(r["median"]),
                                 f"{base['median'] / r['median']:.2f}x", f"{base['min'] / r['min']:.2f}x"])
        g = t["grouped/32"]["min"] / t["grouped/8"]["min"]
        sec.notes.append(verdict(f"{name} grouped 32 -> 8 KV heads (min times)", g, 3.5)
                         + " The bound is 4x, the ratio of keys read; a ratio above it is load noise.")
    return [sec]

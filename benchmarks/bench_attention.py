"""Decode attention time against the number of KV heads (module section 15.5: GQA makes
generation "up to 4x faster" going from 32 to 8 KV heads, because a step reads 4x fewer keys).

One query token, 32 query heads of width 128, a cache of 8,192 tokens with 32, 8 or 1 KV
heads, float32 and bfloat16. Two implementations of the same maths:
    grouped  llamablock's `Attention.attend`: the g query heads of a group stacked into one
             (g, d) x (d, s) matmul per KV head, each cached key read once;
    sdpa     torch's scaled_dot_product_attention(enable_gqa=True).
The speed-up columns are time(32 KV heads) / time(this), per implementation and dtype, from
medians and from minima (the minimum is the estimate least disturbed by other processes).
Two more tables split the grouped call, per dtype, into its matmuls and a plain read of K and V,
with warm and cold caches: the measured account of where each dtype stands against the target.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from benchmarks.common import Section, ms, verdict
from llamablock.attention import Attention, AttentionInputs
from llamablock.config import ModelConfig
from llamablock.util.timing import best_time, eviction_buffer, l3_size, time_calls

DECODE = AttentionInputs()  # one new token after a full cache: nothing to mask

NAME = "attention"
CLAIM = "GQA decode: 32 -> 8 KV heads at 8,192 tokens at least 3.5x faster (4x is the limit)"
KV_HEADS = (32, 8, 1)


def _attention(n_kv: int, d: int, h: int) -> Attention:
    cfg = ModelConfig(vocab_size=8, d_model=h * d, n_layers=1, n_heads=h, n_kv_heads=n_kv, head_dim=d,
                      d_ff=8, max_seq_len=1 << 16)
    with torch.device("meta"):  # the projections are not used: only attend is timed
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
            fns[("grouped", n_kv)] = lambda att=att, q=q, k=k, v=v: att.attend(q, k, v, DECODE)
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
        kv_bytes = {n: 2 * s * d * n * dtype.itemsize for n in (32, 8)}  # K and V read per call
        rate = {n: kv_bytes[n] / t[f"grouped/{n}"]["min"] / 1e9 for n in (32, 8)}
        sec.notes.append(verdict(f"{name} grouped 32 -> 8 KV heads (min times)", g, 3.5)
                         + " The bound is 4x, the ratio of keys read; a ratio above it is load noise."
                         + f" K and V are read at {rate[32]:.1f} GB/s with 32 KV heads, {rate[8]:.1f} with 8.")
    evict = (64 << 20) if quick else (1 << 30)  # 1 GiB: twice this CPU's L3 (480 MiB)
    return [sec] + [attention_parts(dt, s, d, h, repeats, evict) for dt in (torch.float32, torch.bfloat16)]


# Which library runs torch's bmm on this CPU, per dtype (MKL_VERBOSE / ONEDNN_VERBOSE, torch 2.13).
BMM_LIBRARY = {torch.float32: "MKL's SGEMM_BATCH", torch.bfloat16: "oneDNN's AMX matmul"}


def attention_parts(dtype: torch.dtype, s: int, d: int, h: int, repeats: int, evict_bytes: int) -> Section:
    """Where the grouped attention's time goes, 32 against 8 KV heads, with the caches warm (the
    same call back to back) and cold (`evict_bytes` read before each call)."""
    name = str(dtype).removeprefix("torch.")
    sec = Section(f"Parts of the {name} grouped attention, 32 and 8 KV heads, {s} cached tokens, warm and cold caches",
                  ["part", "caches", "32 heads ms", "8 heads ms", "32 / 8", "32 heads GB/s", "8 heads GB/s"])
    parts = {}
    for n_kv in (32, 8):
        g = h // n_kv
        att = _attention(n_kv, d, h)
        q, k, v = (torch.randn(1, n, t, d, dtype=dtype) for n, t in ((h, 1), (n_kv, s), (n_kv, s)))
        qg = q.reshape(1, n_kv, g, d)  # (b, n_kv, g, d): the group's query rows, as attend stacks them
        probs = torch.softmax(torch.randn(1, n_kv, g, s), dim=-1).to(dtype)  # (b, n_kv, g, s)
        kv = k.nbytes
        parts[n_kv] = {
            "whole attend": (lambda att=att, q=q, k=k, v=v: att.attend(q, k, v, DECODE), 2 * kv),
            "scores: (g, d) @ (d, s) per KV head": (lambda qg=qg, k=k: qg @ k.transpose(-1, -2), kv),
            "probs @ V: (g, s) @ (s, d) per KV head": (lambda p=probs, v=v: p @ v, kv),
            "read K and V (sum)": (lambda k=k, v=v: k.sum() + v.sum(), 2 * kv),
        }
    evict = eviction_buffer(evict_bytes)
    found = {}
    for part in parts[32]:
        for caches, ev in (("warm", None), ("cold", evict)):
            t = {n: best_time(parts[n][part][0], repeats, ev) for n in (32, 8)}
            gbs = {n: parts[n][part][1] / t[n] / 1e9 for n in (32, 8)}
            found[(part, caches)] = (t[32] / t[8], gbs)
            sec.rows.append([part, caches, ms(t[32]), ms(t[8]), f"{t[32] / t[8]:.2f}x", f"{gbs[32]:.1f}", f"{gbs[8]:.1f}"])
    read, whole = found[("read K and V (sum)", "cold")], found[("whole attend", "cold")]
    scores = found[("scores: (g, d) @ (d, s) per KV head", "cold")]
    tried = (" Other layouts of the same products ((K @ qg^T)^T, einsum, one bmm per group row, one mv per head "
             "and row, chunks of 2048 keys) were no faster cold when tried in development (2026-11-30)."
             if dtype == torch.float32 else "")
    sec.notes.append(
        f"Limit, {name} grouped attention: 'cold' reads {evict_bytes >> 20} MiB before each call, so K and V come "
        f"from memory, as in a decode step, which streams the rest of the model between one layer's attention and "
        f"the next. Cold, reading the 8-head K and V alone is {read[0]:.2f}x faster than the 32-head "
        f"({read[1][8]:.1f} against {read[1][32]:.1f} GB/s) and the whole attention {whole[0]:.2f}x. The "
        f"8-head case stacks g = 4 query rows into each matmul, and {BMM_LIBRARY[dtype]} at 4 rows streams "
        f"the keys at {scores[1][8]:.1f} GB/s where at one row (32 heads) it streams {scores[1][32]:.1f}. Warm, the "
        f"8-head case's {parts[8]['whole attend'][1] >> 20} MiB can stay in this CPU's L3 ({l3_size()}, shared with the machine's "
        f"other tenants) and the ratio is {found[('whole attend', 'warm')][0]:.2f}x. The table above alternates "
        f"32 with 8 heads round by round, which lands in between.{tried}")
    return sec

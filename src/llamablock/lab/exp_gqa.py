"""Section 15.5: grouped-query attention and the KV cache (module lab 4b).

Cache sizes are checked three ways: the closed form of the module, the calculator behind
`llamablock kv-cache`, and the bytes that `KVCache` really allocates. Allocating LLaMA 3 8B's
32-head cache at once would take 4 GiB (16 GiB for the exercise), so one layer is allocated
for real and multiplied by the layer count; every layer's buffers have the same shape.
"""

from __future__ import annotations

import itertools

import torch
import torch.nn.functional as F

from llamablock.attention import Attention, AttentionInputs, attention_inputs
from llamablock.config import ModelConfig
from llamablock.diagnostics.kv_calculator import kv_cache_size
from llamablock.kv_cache import KVCache
from llamablock.lab.record import Claim
from llamablock.presets import preset
from llamablock.util.timing import best_time, eviction_buffer, l3_size, time_calls
from llamablock.util.units import human_bytes

GiB = 2**30


# The ids of the claims this experiment records (for `llamablock lab --only`).
CLAIMS = (
    "15.5.cache-bytes",
    "15.5.cache-exercise",
    "15.5.gqa-equals-mha",
    "15.5.attention-params",
    "15.5.decode-speed",
)


def allocated_bytes(cfg: ModelConfig, tokens: int, dtype: str) -> int:
    one_layer = KVCache(cfg.replace(n_layers=1), batch_size=1, max_len=tokens, dtype=getattr(torch, dtype))
    return one_layer.nbytes() * cfg.n_layers


def claim_cache_sizes() -> Claim:
    cfg = preset("llama-3-8b")
    sizes = {}
    for kv in (32, 8, 1):
        c = cfg.replace(n_kv_heads=kv)
        closed = 2 * c.n_layers * kv * c.head_dim * 8192 * 2
        calc = kv_cache_size(c, 8192, dtype="float16").total_bytes
        real = allocated_bytes(c, 8192, "float16")
        sizes[kv] = (closed, calc, real)
    agree = all(a == b == r for a, b, r in sizes.values())
    measured = [human_bytes(sizes[k][2]) for k in (32, 8, 1)]
    c = Claim("15.5.cache-bytes", "15.5", "LLaMA 3 8B, 8192 tokens, fp16: 32 / 8 / 1 KV heads",
              ["4 GiB", "1 GiB", "128 MiB"], measured=measured, unit="bytes (KVCache allocation)",
              tolerance="exact")
    reduction = 1 - sizes[8][2] / sizes[32][2]
    ok = agree and sizes[32][2] == 4 * GiB and sizes[8][2] == GiB and sizes[1][2] == 128 * 2**20 and reduction == 0.75
    return c.judge(ok, f"closed form, calculator and allocated buffers agree: {agree}; 32 -> 8 heads is a "
                   f"{reduction:.1%} reduction (module: 75.0%)")


def claim_exercise() -> Claim:
    cfg = ModelConfig(vocab_size=2, d_model=4096, n_layers=32, n_heads=32, n_kv_heads=8, head_dim=128)
    got8 = allocated_bytes(cfg, 32768, "bfloat16")
    got32 = kv_cache_size(cfg.replace(n_kv_heads=32), 32768, dtype="bfloat16").total_bytes
    c = Claim("15.5.cache-exercise", "15.5", "exercise: 32 layers, d_head 128, 32768 tokens, bf16, 8 KV heads",
              "4 GiB (16 GiB with 32)", measured=f"{got8 / GiB:g} GiB ({got32 / GiB:g} GiB with 32)",
              tolerance="within 0.01 GiB (the exercise's)")
    return c.judge(abs(got8 / GiB - 4) < 0.01 and abs(got32 / GiB - 16) < 0.01,
                   f"8 heads: {got8:,} bytes allocated by KVCache (one layer x 32); 32 heads from the calculator")


def textbook_mha(attn: Attention, x: torch.Tensor) -> torch.Tensor:
    """Multi-head attention as Module 6 writes it: every head its own keys and values."""
    b, t, _ = x.shape
    h, d = attn.h, attn.hd

    def heads(y):  # (b, t, h*hd) -> (b, h, t, hd)
        return y.view(b, t, h, d).transpose(1, 2)

    out = F.scaled_dot_product_attention(heads(attn.wq(x)), heads(attn.wk(x)), heads(attn.wv(x)), is_causal=True)
    return attn.wo(out.transpose(1, 2).reshape(b, t, h * d))


def claim_gqa_is_mha() -> Claim:
    worst = 0.0
    for seed in range(5):
        torch.manual_seed(seed)
        cfg = ModelConfig(vocab_size=2, d_model=64, n_layers=1, n_heads=8, n_kv_heads=8, position="none")
        attn = Attention(cfg)
        x = torch.randn(2, 33, 64)
        with torch.no_grad():
            worst = max(worst, float((attn(x, attention_inputs(torch.arange(33).expand(2, 33), 0, dtype=x.dtype)) - textbook_mha(attn, x)).abs().max()))
    c = Claim("15.5.gqa-equals-mha", "15.5", "GQA with h_kv = h_q reproduces MHA bit for bit", 0.0, measured=worst,
              unit="largest |difference|", tolerance="exactly 0.0")
    return c.judge(worst == 0.0, "llamablock's grouped attention with 8 KV heads for 8 query heads against a "
                   "textbook per-head MHA from the same weights, 5 seeds, 33 tokens, float32")


def attention_params(d_model: int, n_heads: int, head_dim: int, kv: int, qkv_bias: bool, o_bias: bool) -> int:
    cfg = ModelConfig(vocab_size=2, d_model=d_model, n_layers=1, n_heads=n_heads, n_kv_heads=kv,
                      head_dim=head_dim, qkv_bias=qkv_bias, o_bias=o_bias, position="none")
    return sum(p.numel() for p in Attention(cfg).parameters())


def claim_param_counts() -> Claim:
    """Search small configurations for the module's 16,448 -> 9,280 (8 -> 1 KV heads)."""
    matches = []
    for d_model, n_heads, qkv_bias, o_bias in itertools.product((32, 64, 128), (8,), (False, True), (False, True)):
        head_dim = d_model // n_heads
        a = attention_params(d_model, n_heads, head_dim, 8, qkv_bias, o_bias)
        b = attention_params(d_model, n_heads, head_dim, 1, qkv_bias, o_bias)
        if (a, b) == (16448, 9280):
            matches.append(f"d_model {d_model}, {n_heads} query heads of width {head_dim}, "
                           f"q/k/v bias {qkv_bias}, output bias {o_bias}")
    c = Claim("15.5.attention-params", "15.5", "attention parameters as KV heads go 8 -> 1", [16448, 9280],
              measured=[16448, 9280] if matches else None, tolerance="exact, for some configuration")
    if not matches:
        return c.judge(False, "no configuration in the searched range gives these counts")
    return c.judge(True, "found: " + "; ".join(matches) + ". That is an nn.MultiheadAttention-like layer whose "
                   "output projection keeps its bias while q, k, v have none.")


def claim_decode_speed(quick: bool) -> Claim:
    """Decode attention alone: one query token against 8192 cached tokens, 32 query heads of 128."""
    c = Claim("15.5.decode-speed", "15.5", "up to 4x faster decode from 32 to 8 KV heads", 4.0,
              unit="time ratio 32 / 8 KV heads (median)", tolerance="reproduced if >= 3 (4 is the limit)")
    cfg = ModelConfig(vocab_size=2, d_model=4096, n_layers=1, n_heads=32, head_dim=128, position="none")
    tokens = 8192
    fns, sdpa = {}, {}
    for kv in (32, 8, 1):
        attn = Attention(cfg.replace(n_kv_heads=kv))
        q = torch.randn(1, 32, 1, 128)
        k, v = torch.randn(1, kv, tokens, 128), torch.randn(1, kv, tokens, 128)
        fns[kv] = (lambda a=attn, q=q, k=k, v=v: a.attend(q, k, v, AttentionInputs()))  # one new token: no mask
        sdpa[kv] = (lambda q=q, k=k, v=v, g=kv != 32: F.scaled_dot_product_attention(q, k, v, enable_gqa=g))
    t = time_calls({**{f"grouped-{k}": f for k, f in fns.items()}, **{f"sdpa-{k}": f for k, f in sdpa.items()}},
                   repeats=10 if quick else 40)
    med = {k: v["median"] for k, v in t.items()}
    c.measured = med["grouped-32"] / med["grouped-8"]
    # The alternating rounds leave part of the 8-head case's 64 MiB of K/V in the L3 or not, so the
    # ratio lies between two ends, timed here: back to back (warm) and after reading 1 GiB (cold,
    # as in a real decode step, which streams the rest of the model between two attentions).
    reps, evict = (3, 5) if quick else (10, 15), eviction_buffer()
    warm = best_time(fns[32], reps[0]) / best_time(fns[8], reps[0])
    cold = best_time(fns[32], reps[1], evict) / best_time(fns[8], reps[1], evict)
    return c.judge(c.measured >= 3.0, "float32, this CPU, attention step only (cache reading dominates): "
                   f"llamablock grouped matmul {med['grouped-32'] * 1e3:.2f} / {med['grouped-8'] * 1e3:.2f} / "
                   f"{med['grouped-1'] * 1e3:.2f} ms for 32 / 8 / 1 KV heads (32->8: {c.measured:.2f}x, 32->1: "
                   f"{med['grouped-32'] / med['grouped-1']:.2f}x); torch SDPA with enable_gqa "
                   f"{med['sdpa-32'] * 1e3:.2f} / {med['sdpa-8'] * 1e3:.2f} / {med['sdpa-1'] * 1e3:.2f} ms "
                   f"(32->8: {med['sdpa-32'] / med['sdpa-8']:.2f}x). 32->8 with the 8-head K/V left in the "
                   f"caches (back to back): {warm:.2f}x; read from memory (1 GiB read before each call): "
                   f"{cold:.2f}x (this CPU's L3: {l3_size()}; `llamablock bench attention` splits the call)")


def plot_cache(out) -> list[str]:
    """The gqa figure: LLaMA 3 8B's fp16 cache against context length for 32, 8 and 1 KV heads."""
    from llamablock.lab.plots import new_figure, save

    cfg = preset("llama-3-8b")
    tokens = [1024 * 2**i for i in range(8)]
    fig, ax = new_figure()
    for kv in (32, 8, 1):
        ax.plot(tokens, [kv_cache_size(cfg, t, kv_heads=kv).total_bytes / GiB for t in tokens], marker="o",
                label=f"{kv} KV heads" + (" (MHA)" if kv == 32 else " (LLaMA 3 8B)" if kv == 8 else " (MQA)"))
    ax.axvline(8192, color="grey", linestyle=":")
    ax.set(xscale="log", yscale="log", xlabel="tokens", ylabel="KV cache, GiB (fp16, batch 1)",
           title="LLaMA 3 8B: the cache is proportional to the KV heads")
    ax.legend()
    return save(fig, out, "kv-cache.png")


def run(quick: bool, out) -> list[Claim]:
    sizes = claim_cache_sizes()
    sizes.plots = plot_cache(out)
    return [sizes, claim_exercise(), claim_gqa_is_mha(), claim_param_counts(), claim_decode_speed(quick)]

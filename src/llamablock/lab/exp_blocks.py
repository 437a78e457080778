"""Section 15.6 (the two blocks side by side) and the module's exercises, answered by the code."""

from __future__ import annotations

import sympy

from llamablock.diagnostics.kv_calculator import kv_cache_size
from llamablock.ffn import gated_ffn_width
from llamablock.lab.record import Claim
from llamablock.model import Decoder
from llamablock.norm import make_norm
from llamablock.presets import preset

# The changes of the module's table (15.6), as the config fields that carry them.
CHANGES = {
    "position": ("15.1", "RoPE in attention instead of a position vector added once"),
    "norm": ("15.3", "RMSNorm instead of LayerNorm"),
    "norm_placement": ("15.3 / 8.5", "before each sub-layer (pre-LN) instead of after the add"),
    "ffn": ("15.4", "SwiGLU instead of ReLU/GELU"),
    "n_kv_heads": ("15.5", "groups of query heads share a key-value head"),
    "qkv_bias": ("15.6", "no biases"),
    "tie_embeddings": ("15.6", "untied output layer"),
}


# The ids of the claims this experiment records (for `llamablock lab --only`).
CLAIMS = (
    "15.6.side-by-side",
    "ex.four-changes",
    "ex.rotation-product",
    "ex.swiglu-width",
    "ex.rmsnorm-saving",
    "ex.kv-cache",
)


def claim_side_by_side() -> Claim:
    old, new = preset("gpt-2017-small"), preset("llama-2024-small")
    a, b = Decoder(old).num_parameters(), Decoder(new).num_parameters()
    kv_a, kv_b = old.kv_bytes_per_token(2), new.kv_bytes_per_token(2)
    diff = [f for f in CHANGES if getattr(old, f) != getattr(new, f)]
    c = Claim("15.6.side-by-side", "15.6", "same shape, same size; the 2024 block needs less cache",
              "equal parameters", measured={"params_2017": a, "params_2024": b, "kv_bytes_per_token_2017": kv_a,
                                            "kv_bytes_per_token_2024": kv_b},
              unit="parameters; fp16 KV bytes per token", tolerance="parameters within 2%")
    return c.judge(abs(a - b) / max(a, b) < 0.02 and set(diff) == set(CHANGES),
                   f"presets gpt-2017-small ({a:,} parameters) and llama-2024-small ({b:,}, "
                   f"{(b - a) / a:+.2%}); KV cache {kv_a:,} vs {kv_b:,} bytes per token (pairs of query heads "
                   "share a KV head). Config fields that differ: "
                   + "; ".join(f"{f} ({CHANGES[f][0]}): {getattr(old, f)} -> {getattr(new, f)}" for f in diff))


def exercise_four_changes() -> Claim:
    old, new = preset("gpt-2017-small"), preset("llama-2024-small")
    computing = [f for f in ("position", "norm", "ffn", "n_kv_heads") if getattr(old, f) != getattr(new, f)]
    c = Claim("ex.four-changes", "exercises", "the four changes that alter what is computed or stored",
              "RoPE 15.1, RMSNorm 15.3, SwiGLU 15.4, GQA 15.5",
              measured=", ".join(f"{CHANGES[f][1]} ({CHANGES[f][0]})" for f in computing), tolerance="same four")
    return c.judge(len(computing) == 4, "read off the two presets' configs")


def exercise_rotation() -> Claim:
    m, n = sympy.symbols("m n", real=True)

    def rot(a):
        return sympy.Matrix([[sympy.cos(a), -sympy.sin(a)], [sympy.sin(a), sympy.cos(a)]])

    product = sympy.simplify(rot(m).T * rot(n))
    ok = sympy.simplify(product - rot(n - m)) == sympy.zeros(2, 2)
    c = Claim("ex.rotation-product", "exercises", "show R(m)^T R(n) = R(n - m)", "R(n - m)",
              measured=str(product.tolist()), tolerance="symbolic equality")
    return c.judge(ok, "sympy: top-left cos m cos n + sin m sin n = cos(n - m); bottom-left sin(n - m)")


def exercise_width() -> Claim:
    raw = 8 * 4096 / 3
    c = Claim("ex.swiglu-width", "exercises", "SwiGLU inner width at d = 4096 before rounding", 10922.67,
              measured=round(raw, 2), tolerance="within 1")
    return c.judge(abs(raw - 10922.67) <= 1, f"rounded up to a multiple of 256: {gated_ffn_width(4096)}")


def exercise_norm_saving() -> Claim:
    d = 4096
    saving = sum(p.numel() for p in make_norm("layernorm", d, 1e-5).parameters()) - d
    c = Claim("ex.rmsnorm-saving", "exercises", "parameters RMSNorm saves at d = 4096", 4096, measured=saving,
              tolerance="within 0")
    return c.judge(saving == 4096, "LayerNorm's 2d minus RMSNorm's d, counted from the layers")


def exercise_cache() -> Claim:
    cfg = preset("llama-3-8b")
    gib = kv_cache_size(cfg, 32768, dtype="bfloat16").total_bytes / 2**30
    c = Claim("ex.kv-cache", "exercises", "32 layers, d_head 128, 32768 tokens, bf16, 8 KV heads", 4, measured=gib,
              unit="GiB", tolerance="within 0.01")
    return c.judge(abs(gib - 4) <= 0.01, "llamablock kv-cache --config llama-3-8b --tokens 32768 --dtype bfloat16")


def run(quick: bool, out) -> list[Claim]:
    return [claim_side_by_side(), exercise_four_changes(), exercise_rotation(), exercise_width(),
            exercise_norm_saving(), exercise_cache()]

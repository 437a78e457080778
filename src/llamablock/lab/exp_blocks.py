"""Section 15.6 (the two blocks side by side) and the module's exercises, answered by the code."""

from __future__ import annotations

import sympy
import torch

from llamablock import ffn as ffn_lib
from llamablock.config import ModelConfig
from llamablock.diagnostics.kv_calculator import kv_cache_size
from llamablock.lab.details_text import said
from llamablock.lab.record import Claim
from llamablock.lab.shared import allocated_bytes, param_saving
from llamablock.model import Decoder
from llamablock.norm import RMSNorm
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


def _linears(block) -> list:
    return [m for m in block.modules() if isinstance(m, torch.nn.Linear)]


def _causal(model: Decoder) -> bool:
    """Changing the last token leaves every earlier position's logits exactly unchanged."""
    ids = torch.randint(0, model.cfg.vocab_size, (1, 12), generator=torch.Generator().manual_seed(0))
    other = ids.clone()
    other[0, -1] = (other[0, -1] + 1) % model.cfg.vocab_size
    with torch.no_grad():
        return bool(torch.equal(model(ids)[0, :-1], model(other)[0, :-1]))


def claim_side_by_side() -> Claim:
    """The module's table (15.6), row by row, read off the two small presets and the models they
    build: the norm at the end and the matrices and biases are counted in the built blocks, d_ff is
    held to the library's rounding of 8/3 d, and the shape the module says is unchanged (residual
    width, blocks, causal next-token logits) is checked on both models."""
    old, new = preset("gpt-2017-small"), preset("llama-2024-small")
    torch.manual_seed(0)
    m_old, m_new = Decoder(old).eval(), Decoder(new).eval()
    lin_old, lin_new = _linears(m_old.layers[0]), _linears(m_new.layers[0])
    ffn_old, ffn_new = _linears(m_old.layers[0].ffn), _linears(m_new.layers[0].ffn)
    rule = ffn_lib.gated_ffn_width(new.d_model)  # 8/3 d rounded up to a multiple of 256, as LLaMA
    rows = {
        "position": (old.position in ("learned", "sinusoidal"), new.position == "rope"),
        "normalization": ((old.norm, old.norm_placement) == ("layernorm", "post")
                          and isinstance(m_old.final_norm, torch.nn.Identity),
                          (new.norm, new.norm_placement) == ("rmsnorm", "pre")
                          and isinstance(m_new.final_norm, RMSNorm)),
        "feed-forward": (old.ffn in ("relu", "gelu") and old.d_ff == 4 * old.d_model and len(ffn_old) == 2,
                         new.ffn == "swiglu" and new.d_ff == rule and len(ffn_new) == 3),
        "attention heads": (old.n_kv_heads == old.n_heads, new.n_kv_heads < new.n_heads),
        "biases": (all(m.bias is not None for m in lin_old), all(m.bias is None for m in lin_new)),
        "embeddings": (old.tie_embeddings, not new.tie_embeddings),
        "shape unchanged": (old.d_model == new.d_model and old.n_layers == new.n_layers and _causal(m_old),
                            _causal(m_new)),
    }
    a, b = m_old.num_parameters(), m_new.num_parameters()
    c = Claim("15.6.side-by-side", "15.6", "the module's table: six rows that differ, and the shape that does not",
              "six rows; shape unchanged", measured=", ".join(f"{k}: {'yes' if all(v) else 'NO'}" for k, v in rows.items()),
              unit="row as the module states it, in both presets and the models they build",
              tolerance="every row, both columns")
    changed = [said("15.6.side-by-side change", field=f, section=CHANGES[f][0], old=getattr(old, f), new=getattr(new, f))
               for f in CHANGES if getattr(old, f) != getattr(new, f)]
    rest = said("15.6.side-by-side rest", final_old=type(m_old.final_norm).__name__,
                final_new=type(m_new.final_norm).__name__, ffn_old=len(ffn_old), ffn_new=len(ffn_new),
                d_ff_old=old.d_ff, times=old.d_ff / old.d_model, d_ff_new=new.d_ff, d=new.d_model,
                eight_thirds=8 * new.d_model / 3, rule=rule, bias_old=sum(m.bias is not None for m in lin_old),
                linear_old=len(lin_old), bias_new=sum(m.bias is not None for m in lin_new), linear_new=len(lin_new),
                d_old=old.d_model, layers_old=old.n_layers, layers_new=new.n_layers,
                causal=_causal(m_old) and _causal(m_new), params_old=a, params_new=b,
                kv_old=old.kv_bytes_per_token(2), kv_new=new.kv_bytes_per_token(2))
    return c.judge(all(all(v) for v in rows.values()), said("15.6.side-by-side"), *changed, rest)


def exercise_four_changes() -> Claim:
    old, new = preset("gpt-2017-small"), preset("llama-2024-small")
    computing = [f for f in ("position", "norm", "ffn", "n_kv_heads") if getattr(old, f) != getattr(new, f)]
    c = Claim("ex.four-changes", "exercises", "the four changes that alter what is computed or stored",
              "RoPE 15.1, RMSNorm 15.3, SwiGLU 15.4, GQA 15.5",
              measured=", ".join(f"{CHANGES[f][1]} ({CHANGES[f][0]})" for f in computing), tolerance="same four")
    return c.define(said("ex.four-changes"))


def rot(a):
    """The 2 x 2 rotation by angle a (sympy), as the exercise defines R(a)."""
    return sympy.Matrix([[sympy.cos(a), -sympy.sin(a)], [sympy.sin(a), sympy.cos(a)]])


def exercise_rotation() -> Claim:
    m, n = sympy.symbols("m n", real=True)
    gap = sympy.Symbol("n - m", real=True)  # the product written in the gap the module names
    product = sympy.simplify(rot(m).T * rot(n))
    ok = sympy.simplify(product - rot(n - m)) == sympy.zeros(2, 2)
    c = Claim("ex.rotation-product", "exercises", "show R(m)^T R(n) = R(n - m)", "R(n - m)",
              measured=str(sympy.simplify(product.subs(n, m + gap)).tolist()), unit="R(m)^T R(n) by sympy",
              tolerance="symbolic equality")
    return c.judge(ok, said("ex.rotation-product", zero=ok))


def exercise_width() -> Claim:
    got = ffn_lib.gated_ffn_width(4096, multiple_of=1)
    c = Claim("ex.swiglu-width", "exercises", "SwiGLU inner width at d = 4096 before rounding", 10922.67,
              measured=got, unit="llamablock.ffn.gated_ffn_width(4096, multiple_of=1)", tolerance="within 1")
    return c.judge(abs(got - 10922.67) <= 1, said("ex.swiglu-width", width=got, rounded=ffn_lib.gated_ffn_width(4096)))


def exercise_norm_saving() -> Claim:
    saving = param_saving(4096)
    c = Claim("ex.rmsnorm-saving", "exercises", "parameters RMSNorm saves at d = 4096", 4096, measured=saving,
              tolerance="within 0")
    return c.judge(saving == 4096, said("ex.rmsnorm-saving"))


def exercise_cache() -> Claim:
    cfg = ModelConfig(vocab_size=2, d_model=4096, n_layers=32, n_heads=32, n_kv_heads=8, head_dim=128)
    got8 = allocated_bytes(cfg, 32768, "bfloat16") / 2**30
    got32 = kv_cache_size(cfg.replace(n_kv_heads=32), 32768, dtype="bfloat16").total_bytes / 2**30
    c = Claim("ex.kv-cache", "exercises", "32 layers, d_head 128, 32768 tokens, bf16, 8 KV heads", 4,
              measured=round(got8, 4), unit="GiB", tolerance="within 0.01 (16 with 32 heads)")
    return c.judge(abs(got8 - 4) <= 0.01 and abs(got32 - 16) <= 0.01,
                   said("ex.kv-cache", gib32=got32))


def run(quick: bool, out) -> list[Claim]:
    return [claim_side_by_side(), exercise_four_changes(), exercise_rotation(), exercise_width(),
            exercise_norm_saving(), exercise_cache()]

"""RoPE inverse frequencies and their context-extension family (module section 15.2).

`rope_frequencies(cfg, seq_len)` returns (inv_freq (rotary_dim/2,) float32, attention_factor).
The type comes from `cfg.rope_scaling`, a transformers-style dict with `rope_type`; None means
the default schedule theta_i = base^(-2i/d). Raising the base (LLaMA 3: 10,000 -> 500,000) is
not a type: it is just `rope_theta`. The non-RoPE route of 15.2, ALiBi, is `position="alibi"`
in the config (alibi.py): nothing here applies to it.

    type       what it does to pair i (d = rotary width, s = factor, L = original length)
    default    theta_i = base^(-2i/d)
    linear     theta_i / s: position p is turned as p/s was (position interpolation)
    ntk        base' = base * s^(d/(d-2)), static NTK-aware scaling. NOT a transformers type:
               llamablock's own name for the closed form of bloc97's post, tested against it
    dynamic    ntk with s' = s*n/L - (s-1) from the current length n (>= L), so nothing changes
               up to L; transformers' "dynamic". `-consistent`: the same, keys re-rotated (below)
    yarn       per pair a ramp between theta_i (fast pairs, > beta_fast turns in L) and
               theta_i / s (slow pairs, < beta_slow turns), cos/sin times 0.1 ln s + 1
    llama3     LLaMA 3.1: wavelength < L/high_freq_factor unchanged, > L/low_freq_factor
               divided by s, a smooth blend between
    longrope   per-pair divisors: short_factor up to L, long_factor past it

Defaults follow transformers 5 (modeling_rope_utils.py; the tests compare to 1e-6). Known
differences elsewhere, with a keyword switch where a user may need the other:
  * L: `original_max_position_embeddings` (a top-level one, as Phi-3 writes, wins for yarn,
    llama3, longrope: io/hf_config.py), else `max_position_embeddings` (`cfg.max_seq_len`), which
    transformers' dynamic always reads; max_seq_len here is the context a run allows (--ctx-size
    raises it), so a dynamic dict may name L (io/scaling_flags.py does; transformers' never do).
  * transformers' dynamic keeps the largest length seen, across calls, until one shorter than L;
    here each forward pass follows its own largest position (no state).
  * transformers 4.x before PR #40320 replaced yarn's `factor` by max_position_embeddings /
    original_max_position_embeddings whenever both lengths were given (Qwen's 32768/32768
    silently meant factor 1): `yarn_frequencies(..., factor_from_lengths=True)` reads it so.
  * llama.cpp scales yarn's ramp by `ext_factor` (1 = transformers, 0 = plain interpolation
    and no 0.1 ln s term): `yarn_frequencies(..., ext_factor=...)`.
  * litgpt clamps llama3's blend to [0, 1] for every pair instead of choosing by band: the
    same values outside the exact band edges, so there is no switch.
  * dynamic clamps n to at least L: `dynamic_base(..., clamp=False)` shows the unclamped formula.

Each method is a pure function of four settings, `rope_theta`, `rotary_dim`, `max_seq_len` and
`rope_scaling` (llama-models' `apply_scaling`, mlx-lm's rope_utils): no state, every constant
read from them. A `ModelConfig` has them; `RopeSpec` holds just them, for tools that study RoPE
without a model (the per-pair table, the page, the lab).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable

import torch


@dataclasses.dataclass(frozen=True)
class RopeSpec:
    """What RoPE's frequencies depend on, and nothing else (ModelConfig's names): the base, the
    rotary width r, the model's context (dynamic's L, the others' fallback L), the scaling dict."""

    rope_theta: float
    rotary_dim: int
    max_seq_len: int
    rope_scaling: dict[str, Any] | None = None

    def __post_init__(self):
        r, n = self.rotary_dim, self.max_seq_len
        if not (self.rope_theta > 0 and isinstance(r, int) and r > 0 and r % 2 == 0 and isinstance(n, int) and n > 0):
            raise ValueError(f"RoPE needs a positive base, an even positive rotary width (it rotates pairs) and a "
                             f"positive context; got base {self.rope_theta!r}, width {r!r}, context {n!r}")
        validate_rope_scaling(self)

    @classmethod
    def of(cls, cfg) -> "RopeSpec":
        """The RoPE settings of a ModelConfig (or of anything with the same four attributes)."""
        return cls(cfg.rope_theta, cfg.rotary_dim, cfg.max_seq_len, cfg.rope_scaling)

    def replace(self, **changes) -> "RopeSpec":
        return dataclasses.replace(self, **changes)


def default_inv_freq(base: float, dim: int) -> torch.Tensor:
    """theta_i = base^(-2i/dim) for i = 0 .. dim/2 - 1, in float32 (the formula of 15.1)."""
    # The exponent is formed in float32 and the power taken on the python float base, which
    # is how transformers and Meta compute it; other orders differ in the last bit.
    return 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))


def _p(cfg) -> dict:
    return cfg.rope_scaling or {}


def original_length(cfg) -> int:
    """The training length the method extends from: `original_max_position_embeddings`, else
    `max_position_embeddings` (transformers' `standardize_rope_params` fills it the same way)."""
    return _p(cfg).get("original_max_position_embeddings") or cfg.max_seq_len


def _default(cfg, seq_len: int | None) -> tuple[torch.Tensor, float]:
    return default_inv_freq(cfg.rope_theta, cfg.rotary_dim), 1.0


def _linear(cfg, seq_len: int | None) -> tuple[torch.Tensor, float]:
    """Position interpolation (Chen et al. 2023, kaiokendev): angle(p) = (p/s) theta_i,
    applied to the frequencies, which is the same product."""
    return default_inv_freq(cfg.rope_theta, cfg.rotary_dim) / _p(cfg)["factor"], 1.0


def ntk_base(base: float, factor: float, dim: int) -> float:
    """Static NTK-aware base: base * s^(d/(d-2)), so the slowest pair (i = d/2 - 1) is
    interpolated by exactly s while the fastest (i = 0) is untouched (bloc97, 2023)."""
    return base * factor ** (dim / (dim - 2))


def _ntk(cfg, seq_len: int | None) -> tuple[torch.Tensor, float]:
    dim = cfg.rotary_dim
    return default_inv_freq(ntk_base(cfg.rope_theta, _p(cfg)["factor"], dim), dim), 1.0


def dynamic_base(base: float, factor: float, dim: int, seq_len: int | None, original: int,
                 clamp: bool = True) -> float:
    """Dynamic NTK base for a sequence of `seq_len` tokens: base * (s n / L - (s - 1))^(d/(d-2)).

    transformers clamps n to at least L (`clamp=True`), so short sequences keep the trained
    base. Unclamped, the bracket is negative for n < L (s - 1)/s: that raises ValueError.
    """
    n = original if seq_len is None else (max(seq_len, original) if clamp else seq_len)
    bracket = factor * n / original - (factor - 1)
    if bracket <= 0:
        raise ValueError(
            f"dynamic NTK base would be non-positive: rope_scaling.factor={factor} at length {n} with original "
            f"length {original} gives (factor*n/L - (factor-1)) = {bracket:.4g}; clamp the length to at least L"
        )
    return base * bracket ** (dim / (dim - 2))


def _dynamic(cfg, seq_len: int | None) -> tuple[torch.Tensor, float]:
    """Both dynamic types (they differ in what the cache keeps: `rotates_cached_keys`). L is
    `original_length`; n is the pass's largest position + 1, as transformers' max(position_ids) + 1."""
    dim, factor, original = cfg.rotary_dim, _p(cfg)["factor"], original_length(cfg)
    if seq_len is None or seq_len <= original:
        # Within L: the trained frequencies, bit for bit (transformers' init-time inv_freq).
        return default_inv_freq(cfg.rope_theta, dim), 1.0
    # dynamic_base in float32 tensors, as transformers' forward computes it (its length is a tensor):
    # 1 ulp of inv_freq moves the angle at 131,072 by ~1e-2 rad, so a double base would not match.
    n = torch.tensor(seq_len)
    base = cfg.rope_theta * ((factor * n / original) - (factor - 1)) ** (dim / (dim - 2))
    return 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim)), 1.0


def yarn_attention_factor(p: dict, factor: float) -> float:
    """cos/sin multiplier: explicit `attention_factor`, else mscale(s, mscale)/mscale(s, mscale_all_dim)
    when both are set and non-zero (DeepSeek; equal values cancel to 1), else 0.1 ln s + 1."""
    def mscale(s: float, m: float = 1.0) -> float:
        return 1.0 if s <= 1 else 0.1 * m * math.log(s) + 1.0

    if p.get("attention_factor") is not None:
        return float(p["attention_factor"])
    if p.get("mscale") and p.get("mscale_all_dim"):
        return float(mscale(factor, p["mscale"]) / mscale(factor, p["mscale_all_dim"]))
    return mscale(factor)


def yarn_frequencies(cfg, seq_len: int | None = None, *, factor_from_lengths: bool = False,
                     ext_factor: float = 1.0) -> tuple[torch.Tensor, float]:
    """YaRN (Peng et al. 2023). Pair i turns r_i = L / wavelength_i times in the original
    length L. Pairs with r_i > beta_fast keep theta_i, pairs with r_i < beta_slow get theta_i / s,
    and a linear ramp over the pair index blends between (the correction range is floored and
    ceiled unless `truncate` is false). Computed in the order transformers computes it.
    `factor_from_lengths` and `ext_factor`: see the module docstring."""
    p, dim, base = _p(cfg), cfg.rotary_dim, cfg.rope_theta
    original = original_length(cfg)
    factor = p.get("factor")
    if factor is None or (factor_from_lengths and p.get("original_max_position_embeddings")):
        factor = cfg.max_seq_len / original
    attention = yarn_attention_factor(p, factor)
    beta_fast, beta_slow = p.get("beta_fast") or 32, p.get("beta_slow") or 1

    def pair_for(turns: float) -> float:  # pair index (fractional) that turns `turns` times in L
        return dim * math.log(original / (turns * 2 * math.pi)) / (2 * math.log(base))

    low, high = pair_for(beta_fast), pair_for(beta_slow)
    if p.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001  # transformers' guard against a zero-width ramp
    ramp = ((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)  # 0 fast .. 1 slow
    extrapolate = (1 - ramp) * ext_factor  # weight of the unscaled frequency
    pos_freqs = base ** (torch.arange(0, dim, 2).to(torch.float32) / dim)
    inv_freq = (1.0 / (factor * pos_freqs)) * (1 - extrapolate) + (1.0 / pos_freqs) * extrapolate
    if ext_factor == 0:
        attention = 1.0 if p.get("attention_factor") is None else attention
    return inv_freq, attention


def _llama3(cfg, seq_len: int | None) -> tuple[torch.Tensor, float]:
    """LLaMA 3.1's rescaling: wavelengths below original/high_freq_factor unchanged, above
    original/low_freq_factor divided by `factor`, a smooth blend between (llama-models
    `apply_scaling`, every constant read from the config).

    Llama 4 sets low_freq_factor == high_freq_factor: the blend band has zero width and the
    reference formula divides by zero. Here the blend becomes a step at original/low (a pair
    exactly on the edge is left unchanged), so no inf or nan can appear.
    """
    p = cfg.rope_scaling
    factor, low, high = p["factor"], p["low_freq_factor"], p["high_freq_factor"]
    original = original_length(cfg)
    inv_freq = default_inv_freq(cfg.rope_theta, cfg.rotary_dim)
    wavelen = 2 * math.pi / inv_freq
    low_wavelen, high_wavelen = original / low, original / high
    scaled = torch.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
    if high > low:
        smooth = (original / wavelen - low) / (high - low)
    else:  # degenerate band (Llama 4): a step instead of 0/0
        smooth = (original / wavelen >= low).to(torch.float32)
    blended = (1 - smooth) * scaled / factor + smooth * scaled
    middle = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
    return torch.where(middle, blended, scaled), 1.0


def _longrope(cfg, seq_len: int | None) -> tuple[torch.Tensor, float]:
    """LongRoPE (Phi-3): theta_i / short_factor[i] for sequences up to the original length,
    theta_i / long_factor[i] past it; cos/sin times sqrt(1 + ln s / ln L) unless
    `attention_factor` is given, s = `factor` or max_position_embeddings / original."""
    p, dim = cfg.rope_scaling, cfg.rotary_dim
    original = original_length(cfg)
    factor = p.get("factor")
    if factor is None:
        factor = cfg.max_seq_len / original
    attention = p.get("attention_factor")
    if attention is None:
        attention = 1.0 if factor <= 1 else math.sqrt(1 + math.log(factor) / math.log(original))
    long = seq_len is not None and seq_len > original
    ext = torch.tensor(p["long_factor"] if long else p["short_factor"], dtype=torch.float32)
    shape = torch.arange(0, dim, 2, dtype=torch.int64).float() / dim
    return 1.0 / (ext * cfg.rope_theta**shape), float(attention)


# rope_type -> function(cfg, seq_len) -> (inv_freq, attention_factor)
ROPE_TYPES: dict[str, Callable] = {
    "default": _default, "linear": _linear, "ntk": _ntk, "dynamic": _dynamic, "dynamic-consistent": _dynamic,
    "yarn": yarn_frequencies, "llama3": _llama3, "longrope": _longrope,
}


def rope_type(cfg) -> str:
    return (cfg.rope_scaling or {}).get("rope_type", "default")


def rope_frequencies(cfg, seq_len: int | None = None) -> tuple[torch.Tensor, float]:
    return ROPE_TYPES[rope_type(cfg)](cfg, seq_len)


def follows_length(cfg) -> bool:
    """True when the frequencies depend on the current length, the largest position + 1 of a
    forward pass: both dynamic NTK types, and longrope (short or long factors)."""
    return rope_type(cfg) in ("dynamic", "dynamic-consistent", "longrope")


def rotates_cached_keys(cfg) -> bool:
    """True when the KV cache holds keys BEFORE rotation and every key is rotated with the current
    frequencies at each step (attention.py, `AttentionInputs.key_rope`): dynamic-consistent and
    longrope. A query then meets every key turned at one base: scores depend on distance alone.
    "dynamic" is transformers' cached generation: a key is rotated once, by the pass that cached
    it, so past L a query turned at length n meets keys turned at earlier, shorter lengths.
    Either way, layers above the first hold keys and values computed under earlier bases: only a
    one-layer model (or re-running the prefix) equals the full forward; the tests check that."""
    return rope_type(cfg) in ("dynamic-consistent", "longrope")


# Validation ---------------------------------------------------------------------------------
# Fields each type needs (transformers' `_validate_*_rope_parameters`, except that yarn and
# longrope may leave `factor` out: then it is max_position_embeddings / original length).
_REQUIRED = {
    "linear": ("factor",), "ntk": ("factor",), "dynamic": ("factor",), "dynamic-consistent": ("factor",), "yarn": (),
    "llama3": ("factor", "low_freq_factor", "high_freq_factor"), "longrope": ("short_factor", "long_factor"),
}


def _number(p: dict, key: str, low: float | None = None, strict: bool = False, what: str = "") -> None:
    v = p.get(key)
    if v is None:
        return
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise ValueError(f"rope_scaling.{key} must be a number, got {v!r}")
    if low is not None and (v <= low if strict else v < low):
        raise ValueError(f"rope_scaling.{key} must be {'>' if strict else '>='} {low}, got {v!r}{what}")


def validate_rope_scaling(cfg) -> None:
    """Raise ValueError naming the field for a scaling dict that cannot mean anything."""
    p = cfg.rope_scaling or {}
    kind = rope_type(cfg)
    if kind not in ROPE_TYPES:
        raise ValueError(
            f"rope_scaling.rope_type {kind!r} is unknown; known types are {sorted(ROPE_TYPES)} "
            "(static NTK is 'ntk', llamablock's own name; transformers has no static NTK type)"
        )
    if kind == "default":
        return
    for key in _REQUIRED[kind]:
        if p.get(key) is None:
            raise ValueError(f"rope_scaling.{key} is required for rope_type {kind!r}")
    _number(p, "factor", 1.0, what=": a factor below 1 would shrink the context, not extend it")
    orig = p.get("original_max_position_embeddings")
    if orig is not None and (isinstance(orig, bool) or not isinstance(orig, int) or orig <= 0):
        raise ValueError(f"rope_scaling.original_max_position_embeddings must be a positive integer, got {orig!r}")
    if kind in ("ntk", "dynamic", "dynamic-consistent") and cfg.rotary_dim <= 2:
        raise ValueError(
            f"rope_type {kind!r} needs a rotary width above 2 (head_dim x partial_rotary_factor = {cfg.rotary_dim}): "
            "its base exponent d/(d-2) is undefined at d = 2"
        )
    if kind == "llama3":
        _number(p, "low_freq_factor", 0.0, strict=True)
        _number(p, "high_freq_factor", 0.0, strict=True)
        if p["high_freq_factor"] < p["low_freq_factor"]:
            raise ValueError(
                f"rope_scaling.high_freq_factor ({p['high_freq_factor']}) must be >= low_freq_factor "
                f"({p['low_freq_factor']}): the band of unchanged fast pairs ends at original/high_freq_factor"
            )
    if kind == "yarn":
        for key in ("beta_fast", "beta_slow", "mscale", "mscale_all_dim"):
            _number(p, key, 0.0)
        _number(p, "attention_factor", 0.0, strict=True)
        if (p.get("beta_fast") or 32) < (p.get("beta_slow") or 1):
            raise ValueError(
                f"rope_scaling.beta_fast ({p.get('beta_fast')}) must be >= beta_slow ({p.get('beta_slow')}): "
                "beta_fast counts the turns of the fast pairs, beta_slow of the slow ones"
            )
    if kind == "longrope":
        _number(p, "attention_factor", 0.0, strict=True)
        for key in ("short_factor", "long_factor"):
            v = p[key]
            if not isinstance(v, (list, tuple)) or len(v) != cfg.rotary_dim // 2:
                n = len(v) if isinstance(v, (list, tuple)) else type(v).__name__
                raise ValueError(
                    f"rope_scaling.{key} must be a list of rotary_dim/2 = {cfg.rotary_dim // 2} numbers, got {n}"
                )
            if not all(isinstance(x, (int, float)) and not isinstance(x, bool) and 0 < x < math.inf for x in v):
                raise ValueError(f"rope_scaling.{key} must hold positive finite numbers only (Infinity or NaN "
                                 "would turn its pairs' frequencies to 0 or NaN)")

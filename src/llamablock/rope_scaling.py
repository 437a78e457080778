"""RoPE inverse frequencies and their context-extension family (module section 15.2).

`rope_frequencies(cfg, seq_len)` returns (inv_freq (rotary_dim/2,) float32, attention_factor).
The scaling type comes from `cfg.rope_scaling`, a transformers-style dict with `rope_type`;
None means the default schedule theta_i = base^(-2i/d).

Each method is a pure function of the config, as llama-models' `apply_scaling` and mlx-lm's
rope_utils are: no state, no constants that the config does not hold.
"""

from __future__ import annotations

import math
from typing import Callable

import torch


def default_inv_freq(base: float, dim: int) -> torch.Tensor:
    """theta_i = base^(-2i/dim) for i = 0 .. dim/2 - 1, in float32 (the formula of 15.1)."""
    # The exponent is formed in float32 and the power taken on the python float base, which
    # is how transformers and Meta compute it; other orders differ in the last bit.
    return 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))


def _default(cfg, seq_len: int | None) -> tuple[torch.Tensor, float]:
    return default_inv_freq(cfg.rope_theta, cfg.rotary_dim), 1.0


def _llama3(cfg, seq_len: int | None) -> tuple[torch.Tensor, float]:
    """LLaMA 3.1's rescaling: wavelengths below original/high_freq_factor unchanged, above
    original/low_freq_factor divided by `factor`, a smooth blend between (llama-models
    `apply_scaling`, every constant read from the config)."""
    p = cfg.rope_scaling
    factor, low, high = p["factor"], p.get("low_freq_factor", 1.0), p.get("high_freq_factor", 4.0)
    original = p["original_max_position_embeddings"]
    inv_freq = default_inv_freq(cfg.rope_theta, cfg.rotary_dim)
    wavelen = 2 * math.pi / inv_freq
    low_wavelen, high_wavelen = original / low, original / high
    scaled = torch.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
    smooth = (original / wavelen - low) / (high - low)
    blended = (1 - smooth) * scaled / factor + smooth * scaled
    middle = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
    return torch.where(middle, blended, scaled), 1.0


# rope_type -> function(cfg, seq_len) -> (inv_freq, attention_factor)
ROPE_TYPES: dict[str, Callable] = {"default": _default, "llama3": _llama3}


def rope_type(cfg) -> str:
    return (cfg.rope_scaling or {}).get("rope_type", "default")


def validate_rope_scaling(cfg) -> None:
    kind = rope_type(cfg)
    if kind not in ROPE_TYPES:
        raise ValueError(f"rope_scaling.rope_type {kind!r} is unknown; known types are {sorted(ROPE_TYPES)}")


def rope_frequencies(cfg, seq_len: int | None = None) -> tuple[torch.Tensor, float]:
    return ROPE_TYPES[rope_type(cfg)](cfg, seq_len)


def rotates_cached_keys(cfg) -> bool:
    """True when the frequencies depend on the current length (dynamic NTK): then the cache must
    hold keys before rotation, and all keys are rotated with the current base at every step."""
    return False

"""Rotary position embedding (module section 15.1).

Each query and key of width d is split into d/2 pairs; pair i at position m is turned by the
angle m * theta_i with theta_i = base^(-2i/d), i = 0 .. d/2 - 1 (the module counts from 1; the
same schedule). Then <R_m q, R_n k> = q^T R_(n-m) k depends only on the gap m - n.

Two pair layouts are in use, and a checkpoint only works with the one it was trained in:
    "interleaved"  pairs are neighbours (x0, x1), (x2, x3), ...: the RoPE paper, Meta's
                   llama code and llama.cpp's GGUF files, and the module's equations.
    "half"         pair i is (x_i, x_(i + d/2)): transformers' `rotate_half`. Hugging Face's
                   conversion script permutes the rows of W_q and W_k so the same model
                   computes the same thing in this layout.
`permute_qk` converts weights between the two, once, at load time (never inside forward).

Partial rotary (`partial_rotary_factor` < 1) rotates only the first `rotary_dim` features of
each head and passes the rest through, as transformers does.

Precision: angles are computed in float32 whatever the model dtype, then cos/sin are cast
to the activations' dtype. bfloat16 angles at position 4096 would be off by whole radians.

`Rotary` is RoPE for one model, built once from its config and handed to every attention
layer: the frequencies (rope_scaling.py), the pair layout, whether they follow the length and
whether keys are cached before rotation. The decoder computes cos/sin
once per forward pass; each layer only rotates.
Shapes: the package legend (llamablock/__init__.py).
"""

from __future__ import annotations

import torch

from llamablock.rope_scaling import RopeSpec, follows_length, rope_frequencies, rotates_cached_keys

LAYOUTS = ("half", "interleaved")


def rope_cos_sin(
    cfg, position_ids: torch.Tensor, dtype: torch.dtype, seq_len: int | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin tables of shape (b, t, r/2), one angle per pair, scaled by the attention factor.

    `cfg` is a ModelConfig or a RopeSpec (rope_scaling.py). `seq_len` is the largest position + 1 (transformers' reading), read by the types whose frequencies
    depend on it: dynamic NTK, and longrope (short or long factors).
    """
    inv_freq, attention_factor = rope_frequencies(cfg, seq_len=seq_len)  # (r/2,) float32, on the CPU
    angles = position_ids.to(torch.float32)[..., None] * inv_freq.to(position_ids.device)  # (b, t, r/2)
    cos = angles.cos() * attention_factor
    sin = angles.sin() * attention_factor
    return cos.to(dtype), sin.to(dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, layout: str) -> torch.Tensor:
    """Rotate x (b, h, t, hd) by the angles in cos/sin (b, t, r/2); features past r pass through."""
    r = cos.shape[-1] * 2
    x_rot, x_pass = x[..., :r], x[..., r:]
    cos, sin = cos[:, None], sin[:, None]  # (b, 1, t, r/2): broadcast over heads
    if layout == "half":
        x1, x2 = x_rot[..., : r // 2], x_rot[..., r // 2 :]
        # Written as transformers writes it (x*cos + rotate_half(x)*sin with cos repeated)
        # so that the float32 results agree bit for bit, not just to rounding.
        cos2, sin2 = torch.cat((cos, cos), -1), torch.cat((sin, sin), -1)
        rotated = x_rot * cos2 + torch.cat((-x2, x1), -1) * sin2
    elif layout == "interleaved":
        x1, x2 = x_rot[..., 0::2], x_rot[..., 1::2]
        rotated = torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1).flatten(-2)
    else:
        raise ValueError(f"rope layout must be 'half' or 'interleaved', got {layout!r}")
    return torch.cat((rotated, x_pass), dim=-1) if x_pass.shape[-1] else rotated


def permute_qk(w: torch.Tensor, n_heads: int, head_dim: int, rotary_dim: int, to: str) -> torch.Tensor:
    """Reorder the output rows of W_q or W_k (or their biases) between pair layouts.

    w: (n_heads * head_dim, ...) rows grouped by head. Within each head, the first
    `rotary_dim` rows are reordered: interleaved -> half takes the even rows then the odd
    ones; half -> interleaved undoes it. This is the permutation of Hugging Face's
    convert_llama_weights_to_hf.py and the one llama.cpp's converter reverses.
    """
    if to not in ("half", "interleaved"):
        raise ValueError(f"target layout must be 'half' or 'interleaved', got {to!r}")
    if w.shape[0] != n_heads * head_dim:
        raise ValueError(f"expected {n_heads * head_dim} rows ({n_heads} heads x {head_dim}), got {w.shape[0]}")
    rest = w.shape[1:]
    w = w.reshape(n_heads, head_dim, *rest)
    rot, keep = w[:, :rotary_dim], w[:, rotary_dim:]
    if to == "half":  # rows (0,1),(2,3).. -> 0,2,4,..,1,3,5..
        rot = rot.reshape(n_heads, rotary_dim // 2, 2, *rest).transpose(1, 2)
    else:  # rows 0..r/2-1 are first members, r/2..r-1 second members -> interleave
        rot = rot.reshape(n_heads, 2, rotary_dim // 2, *rest).transpose(1, 2)
    rot = rot.reshape(n_heads, rotary_dim, *rest)
    return torch.cat((rot, keep), dim=1).reshape(n_heads * head_dim, *rest).contiguous()


class Rotary:
    """RoPE for one model: `cos_sin` for a forward pass, `rotate` for each layer's q and k.

    `follows_length` is True for the types whose frequencies depend on the current length (both
    dynamic NTK types, longrope): each pass reads its largest position + 1. `late_keys` is True for
    those of them whose KV cache holds keys before rotation, every key rotated again at each step
    with the current frequencies (dynamic-consistent, longrope; rope_scaling.rotates_cached_keys);
    under "dynamic" a key keeps the rotation it was cached with, as in transformers' cache.
    """

    def __init__(self, spec: RopeSpec, layout: str):
        if layout not in LAYOUTS:
            raise ValueError(f"rope layout must be 'half' or 'interleaved', got {layout!r}")
        self.spec, self.layout = spec, layout
        self.late_keys = rotates_cached_keys(spec)
        self.follows_length = follows_length(spec)

    @classmethod
    def from_config(cls, cfg) -> "Rotary":
        return cls(RopeSpec.of(cfg), cfg.rope_layout)

    def cos_sin(self, position_ids: torch.Tensor, dtype: torch.dtype, seq_len: int | None = None):
        """(cos, sin), each (b, t, r/2), for position_ids (b, t); `seq_len` as in rope_cos_sin."""
        return rope_cos_sin(self.spec, position_ids, dtype, seq_len)

    def rotate(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """x (b, heads, t, hd) rotated in this model's pair layout."""
        return apply_rope(x, cos, sin, self.layout)

    def __repr__(self) -> str:
        return f"Rotary({self.spec}, layout={self.layout!r})"

"""The 2017 block and the 2024 block, side by side (module section 15.6).

Both are built from the same parts; only the arrangement differs:

    2017 (post-LN, Module 7)                2024 (pre-LN, LLaMA)
    x = norm1(x + attn(x))                  x = x + attn(norm1(x))
    x = norm2(x + ffn(x))                   x = x + ffn(norm2(x))

and one descendant (Gemma 2 and 3, beyond the module): the sandwich, pre-LN with a second norm
on each sub-layer's output before the add, x = x + post_norm1(attn(norm1(x))), which bounds
what each block adds to the stream while keeping its main path un-normalized.

With post-LN the residual stream is renormalized after every add; with pre-LN nothing on the
main path is normalized, so each block's addition accumulates and the model ends with one
final norm (`Decoder.final_norm`). Which attention, norm and feed-forward go in is the
config's choice (`make_block`), so the single-change ablations are configs, not new classes.
Both take x (b, t, D), the forward pass's shared attention inputs and the cache; return (b, t, D).
"""

from __future__ import annotations

import torch
from torch import nn

from llamablock.attention import Attention, AttentionInputs
from llamablock.config import ModelConfig
from llamablock.ffn import make_ffn
from llamablock.kv_cache import Cache
from llamablock.norm import make_norm
from llamablock.rope import Rotary


class PostNormBlock(nn.Module):
    """2017: sub-layer, residual add, then LayerNorm."""

    def __init__(self, attn: nn.Module, ffn: nn.Module, norm1: nn.Module, norm2: nn.Module):
        super().__init__()
        self.attn, self.ffn, self.norm1, self.norm2 = attn, ffn, norm1, norm2

    def forward(self, x: torch.Tensor, inputs: AttentionInputs, cache: Cache | None = None) -> torch.Tensor:
        x = self.norm1(x + self.attn(x, inputs, cache))
        return self.norm2(x + self.ffn(x))


class PreNormBlock(nn.Module):
    """2024: RMSNorm, sub-layer, then residual add."""

    def __init__(self, attn: nn.Module, ffn: nn.Module, norm1: nn.Module, norm2: nn.Module):
        super().__init__()
        self.attn, self.ffn, self.norm1, self.norm2 = attn, ffn, norm1, norm2

    def forward(self, x: torch.Tensor, inputs: AttentionInputs, cache: Cache | None = None) -> torch.Tensor:
        x = x + self.attn(self.norm1(x), inputs, cache)
        return x + self.ffn(self.norm2(x))


class SandwichBlock(PreNormBlock):
    """Gemma 2 and 3: RMSNorm, sub-layer, RMSNorm, then residual add."""

    def __init__(self, attn: nn.Module, ffn: nn.Module, norm1: nn.Module, norm2: nn.Module,
                 post_norm1: nn.Module, post_norm2: nn.Module):
        super().__init__(attn, ffn, norm1, norm2)
        self.post_norm1, self.post_norm2 = post_norm1, post_norm2

    def forward(self, x: torch.Tensor, inputs: AttentionInputs, cache: Cache | None = None) -> torch.Tensor:
        x = x + self.post_norm1(self.attn(self.norm1(x), inputs, cache))
        return x + self.post_norm2(self.ffn(self.norm2(x)))


def make_block(cfg: ModelConfig, layer: int, rotary: Rotary | None = None) -> nn.Module:
    """Block `layer` of `cfg`; `rotary` is the RoPE of the layer's kind (shared by those layers) or None."""
    def norm():
        return make_norm(cfg.norm, cfg.d_model, cfg.norm_eps, cfg.norm_offset)

    parts = (Attention(cfg, layer, rotary), make_ffn(cfg), norm(), norm())
    if cfg.sandwich_norm:
        return SandwichBlock(*parts, norm(), norm())
    return (PreNormBlock if cfg.norm_placement == "pre" else PostNormBlock)(*parts)

"""Two training-free context extensions from after the module, on the model's own weights:
Self-Extend's grouped positions and StreamingLLM's attention sinks.

Both keep RoPE's ordinary angles for near keys and give far keys other positions, so each
score q_i . k_j is taken from one of two rotations: (a) q at position i, k at j, the plain
model's; (b) q at P_q(i), k at P_k(j), the method's. RoPE makes the score depend only on the
difference of the two positions, which is what each method sets:

    Self-Extend (Jin et al. 2024; llama.cpp --grp-attn-n G --grp-attn-w W)
        i - j < W: plain; else (b) with P_q(i) = i // G + W - W // G and P_k(j) = j // G,
        so distances past W shrink G times and stay inside the trained context
    StreamingLLM (Xiao et al. 2023), S sink tokens and a window of W
        i - j < W: plain; j < S: (b) with P_q(i) = min(i, S + W - 1), P_k(j) = j, the positions
        the sinks have in a cache that holds S + W tokens and rotates keys by slot; any other key
        is evicted (masked)

The masks and the second rotation are what the Decoder's own attention cannot take from outside
(its inputs are one set of angles and an additive mask), so `with_grouped_attention` returns a
Decoder whose every block's attention is a `GroupedAttention` holding the original's weights.
It attends in blocks of `block` queries against the keys up to the block's end: memory holds
(h, block, s) scores, never (h, t, t). Keys W or more behind a block's first query take one
rotation for the whole block (Self-Extend's grouped one; for sinks, the sinks' and nothing else),
so only the band of the last W + block keys is scored twice, and every other key once (`split`;
benchmark long_loss times a pass beside the plain model's). Shapes: the package legend (llamablock/__init__.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from llamablock.attention import Attention
from llamablock.io.empty import empty_decoder
from llamablock.model import Decoder


@dataclass(frozen=True)
class SelfExtend:
    group: int  # G, llama.cpp's --grp-attn-n
    window: int  # W, the neighbour window, llama.cpp's --grp-attn-w

    def __post_init__(self):
        if self.group < 1 or self.window < 1:
            raise ValueError(f"self-extend needs a group >= 1 and a window >= 1, got {self.group} and {self.window}")

    def positions(self, i: torch.Tensor, j: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return i // self.group + self.window - self.window // self.group, j // self.group

    def choose(self, i: torch.Tensor, j: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(allowed, second) (t, s) bool: which keys a query sees, and which through rotation (b)."""
        d = i[:, None] - j[None, :]
        return d >= 0, d >= self.window

    def split(self, start: int) -> tuple[int, int]:
        """(far, near) for the queries from `start` on: keys 0..far-1 are all seen through rotation
        (b), keys far..near-1 by none of them, and only keys from near on need `choose`. Keys at
        least W behind the block's first query are grouped for every query of it."""
        far = max(0, start - self.window + 1)
        return far, far


@dataclass(frozen=True)
class Sinks:
    sinks: int  # S initial tokens always kept
    window: int  # W most recent tokens kept, the query's own included

    def __post_init__(self):
        if self.sinks < 0 or self.window < 1:
            raise ValueError(f"sinks needs S >= 0 sink tokens and a window >= 1, got {self.sinks} and {self.window}")

    def positions(self, i: torch.Tensor, j: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return i.clamp(max=self.sinks + self.window - 1), j

    def choose(self, i: torch.Tensor, j: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        d = i[:, None] - j[None, :]
        near = (d >= 0) & (d < self.window)
        sink = (d >= self.window) & (j[None, :] < self.sinks)
        return near | sink, sink

    def split(self, start: int) -> tuple[int, int]:
        """As SelfExtend.split: keys at least W behind the block's first query are evicted for every
        query of it, except the sinks among them."""
        behind = max(0, start - self.window + 1)
        return min(self.sinks, behind), behind


class GroupedAttention(nn.Module):
    """`attn`'s projections, norms and RoPE; scores from two rotations chosen per (query, key)."""

    def __init__(self, attn: Attention, scheme: SelfExtend | Sinks, block: int = 128):
        super().__init__()
        if attn.rotary is None or attn.rotary.follows_length:
            raise ValueError("self-extend and sinks need a model with plain RoPE (no rope_scaling of a "
                             "length-dependent type)")
        self.attn, self.scheme, self.block = attn, scheme, block

    def forward(self, x: torch.Tensor, inputs, cache=None) -> torch.Tensor:
        """x (b, t, D) at positions 0..t-1 -> (b, t, D). `inputs` (the plain model's) are not read."""
        if cache is not None:
            raise ValueError("self-extend and sinks are evaluated without a KV cache here")
        a = self.attn
        b, t, _ = x.shape
        q, k, v = self.projections(x)
        pos = torch.arange(t, device=x.device)
        pq, pk = self.scheme.positions(pos, pos)

        def rotated(z, p):
            return a.rotary.rotate(z, *a.rotary.cos_sin(p[None].expand(b, t), z.dtype))

        qa, qb, ka, kb = rotated(q, pos), rotated(q, pq), rotated(k, pos), rotated(k, pk)
        g = a.h // a.n_kv
        out = torch.empty_like(q)
        for start in range(0, t, self.block):
            end = min(start + self.block, t)
            far, near = self.scheme.split(start)  # banded: only keys near..end-1 need both rotations
            allowed, second = self.scheme.choose(pos[start:end], pos[near:end])  # (T, s_near)
            sa = self._scores(qa[:, :, start:end], ka[:, :, near:end], g)  # (b, n_kv, g, T, s_near)
            sb = self._scores(qb[:, :, start:end], kb[:, :, near:end], g)
            scores = torch.where(second, sb, sa).masked_fill(~allowed, float("-inf"))
            if far:
                scores = torch.cat((self._scores(qb[:, :, start:end], kb[:, :, :far], g), scores), dim=-1)
            probs = torch.softmax(scores.float(), dim=-1).to(q.dtype)
            o = probs[..., far:] @ v[:, :, None, near:end]  # (b, n_kv, g, T, hd)
            if far:
                o += probs[..., :far] @ v[:, :, None, :far]
            out[:, :, start:end] = o.reshape(b, a.h, end - start, a.hd)
        return a.wo(out.transpose(1, 2).reshape(b, t, a.h * a.hd))

    def projections(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """x (b, t, D) -> q (b, h, t, hd), k and v (b, n_kv, t, hd), q and k normed where the model norms them."""
        a = self.attn
        b, t, _ = x.shape
        q = a.wq(x).view(b, t, a.h, a.hd).transpose(1, 2)
        k = a.wk(x).view(b, t, a.n_kv, a.hd).transpose(1, 2)
        v = a.wv(x).view(b, t, a.n_kv, a.hd).transpose(1, 2)
        if a.q_norm is not None:
            q, k = a.q_norm(q), a.k_norm(k)
        return q, k, v

    def _scores(self, q: torch.Tensor, k: torch.Tensor, g: int) -> torch.Tensor:
        """q (b, h, T, hd), k (b, n_kv, s, hd) -> (b, n_kv, g, T, s), soft-capped where the model is."""
        a = self.attn
        b, _, T, hd = q.shape
        s = (q.reshape(b, a.n_kv, g, T, hd) @ k[:, :, None].transpose(-1, -2)) * a.scale
        if a.softcap is not None:
            s = torch.tanh(s / a.softcap) * a.softcap
        return s


def with_grouped_attention(model: Decoder, scheme: SelfExtend | Sinks, block: int = 128) -> Decoder:
    """A Decoder sharing `model`'s weights whose every block attends through `GroupedAttention`."""
    cfg = model.cfg
    if cfg.rope_scaling is not None or set(cfg.layer_kinds) != {"full"}:
        raise ValueError("self-extend and sinks are built here for models with plain RoPE on full-attention "
                         "layers only (no rope_scaling, no sliding-window layers)")
    copy = empty_decoder(cfg).assign_weights(dict(model.state_dict()))  # the same tensors, not copies
    for layer in copy.layers:
        layer.attn = GroupedAttention(layer.attn, scheme, block)
    return copy

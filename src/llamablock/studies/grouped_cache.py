"""Self-Extend and StreamingLLM's attention sinks in generation: studies/grouped_attention.py's
scores with a KV cache, behind the engine interface (runtime/engine.py).

Each score q_i . k_j takes one of two rotations (studies/grouped_attention.py): plain (q at i, k
at j) or the method's (q at P_q(i), k at P_k(j)). A key's two rotations never change once its
position is known (P_k(j) is j // G for Self-Extend, j for sinks), so the cache holds every kept
key in both, beside its value and its position; a new query is rotated twice and each score picks
its rotation with the scheme's own `choose`. Nothing is re-rotated, nothing recomputed. A sinks
decode step writes its key into a fixed ring of S + W slots instead (`_ring_step`): appending and
evicting copied the whole cache at every layer and step (`llamablock bench overflow` times a step).

    sinks        llama.cpp has no such mode; StreamingLLM (Xiao et al. 2023): the first S tokens
                 and the W most recent stay, every other key is evicted once no later query can
                 see it, so the cache never holds more than S + W keys and a generation goes on
                 past any context (`generate --context-overflow sinks`)
    Self-Extend  every key stays (llama.cpp's --grp-attn-n G --grp-attn-w W): distances past W
                 shrink G times, so a model reads about G times its trained context

Tested against the cache-free reference, studies/grouped_attention.py's full forward over the same
tokens (tests/studies/test_grouped_cache.py): the same logits at every step.
"""

from __future__ import annotations

import copy

import torch
from torch import nn

from llamablock.model import Decoder
from llamablock.studies.grouped_attention import GroupedAttention, SelfExtend, Sinks

QUERY_BLOCK = 128  # queries scored at once in a prefill: (h, 128, keys) scores, never (h, t, t)


class CachedGroupedAttention(GroupedAttention):
    """`attn` through `scheme`, with a cache of (plain keys, the method's keys, values, positions)."""

    def __init__(self, attn, scheme: Sinks | SelfExtend):
        super().__init__(attn, scheme, QUERY_BLOCK)
        self.reset()

    def reset(self) -> None:
        self.ka = self.kb = self.v = self.pos = None
        self.ring = None  # sinks' decode steps: (keys, values, positions) in S + W slots (_ring_step)
        self.start = 0  # the position of the next new token

    @property
    def kept(self) -> int:
        """Keys in the cache now that a later query can still see."""
        if self.ring is not None:
            return int(self._still_seen(self.ring[2]).logical_and(self.ring[2] >= 0).sum())
        return 0 if self.pos is None else int(self.pos.shape[0])

    def forward(self, x: torch.Tensor, inputs=None, cache=None) -> torch.Tensor:
        """x (b, t, D), the tokens at positions start..start+t-1 -> (b, t, D). `inputs` (the plain
        model's angles) are not read: the positions are this cache's."""
        a = self.attn
        b, t, _ = x.shape
        q, k, v = self.projections(x)  # (b, h, t, hd), (b, n_kv, t, hd) twice
        pos = torch.arange(self.start, self.start + t, device=x.device)  # (t,)
        pq, pk = self.scheme.positions(pos, pos)

        def rotated(z, p):
            return a.rotary.rotate(z, *a.rotary.cos_sin(p[None].expand(b, t), z.dtype))

        qa, qb = rotated(q, pos), rotated(q, pq)
        if isinstance(self.scheme, Sinks) and t == 1:
            return self._ring_step(qa, qb, rotated(k, pos), v, pos)
        self._from_ring()
        keep = (self.ka, self.kb, self.v, self.pos)
        ka, kb, vs, kpos = (new if old is None else torch.cat((old, new), dim=-2 if new.dim() > 1 else 0)
                            for old, new in zip(keep, (rotated(k, pos), rotated(k, pk), v, pos), strict=True))
        g = a.h // a.n_kv
        out = torch.empty_like(q)
        for s in range(0, t, QUERY_BLOCK):
            e = min(s + QUERY_BLOCK, t)
            allowed, second = self.scheme.choose(pos[s:e], kpos)  # (T, keys)
            scores = torch.where(second, self._scores(qb[:, :, s:e], kb, g), self._scores(qa[:, :, s:e], ka, g))
            probs = torch.softmax(scores.masked_fill(~allowed, float("-inf")).float(), dim=-1).to(q.dtype)
            out[:, :, s:e] = (probs @ vs[:, :, None]).reshape(b, a.h, e - s, a.hd)  # (b, n_kv, g, T, hd) -> heads
        self.start += t
        seen = self._still_seen(kpos)  # (keys,) what a later query can still see
        if not bool(seen.all()):  # evict; an index that keeps every key would copy the whole cache for nothing
            ka, kb, vs, kpos = ka[:, :, seen], kb[:, :, seen], vs[:, :, seen], kpos[seen]
        self.ka, self.kb, self.v, self.pos = ka, kb, vs, kpos
        return a.wo(out.transpose(1, 2).reshape(b, t, a.h * a.hd))

    def _ring_step(self, qa, qb, k, v, pos) -> torch.Tensor:
        """One sinks decode step without copying the cache: S + W slots, position i in slot i below S and
        S + (i - S) mod W above, where it overwrites position i - W, the one key query i no longer sees
        (not near, not a sink). A sink's key has the same rotation both ways (P_k(j) = j), so one copy of
        the keys serves both scores; the query's two rotations are chosen per slot as forward does."""
        a, s = self.attn, self.scheme
        if self.ring is None:  # the prefill's cache, each kept key moved into its slot
            n = s.sinks + s.window
            keys = self.ka.new_zeros(*self.ka.shape[:2], n, self.ka.shape[-1])
            values = self.v.new_zeros(*self.v.shape[:2], n, self.v.shape[-1])
            slots = self._slot(self.pos)
            keys[:, :, slots], values[:, :, slots] = self.ka, self.v
            where = self.pos.new_full((n,), -1).index_copy_(0, slots, self.pos)  # -1: an empty slot
            self.ring, self.ka, self.kb, self.v, self.pos = (keys, values, where), None, None, None, None
        keys, values, where = self.ring
        slot = self._slot(pos)
        keys[:, :, slot], values[:, :, slot], where[slot] = k, v, pos  # (b, n_kv, 1, hd) into slot (1,)
        allowed, second = s.choose(pos, where)  # (1, S + W)
        allowed &= where >= 0
        g = a.h // a.n_kv
        scores = torch.where(second, self._scores(qb, keys, g), self._scores(qa, keys, g))
        probs = torch.softmax(scores.masked_fill(~allowed, float("-inf")).float(), dim=-1).to(qa.dtype)
        out = (probs @ values[:, :, None]).reshape(qa.shape[0], a.h, 1, a.hd)
        self.start += 1
        return a.wo(out.transpose(1, 2).reshape(qa.shape[0], 1, a.h * a.hd))

    def _slot(self, p: torch.Tensor) -> torch.Tensor:
        s = self.scheme
        return torch.where(p < s.sinks, p, s.sinks + (p - s.sinks) % s.window)

    def _from_ring(self) -> None:
        """Back to forward's layout (keys in position order, both rotations) before a pass of many tokens."""
        if self.ring is None:
            return
        keys, values, where = self.ring
        seen = (where >= 0) & self._still_seen(where)
        order = where[seen].argsort()
        self.ka = self.kb = keys[:, :, seen][:, :, order]
        self.v, self.pos, self.ring = values[:, :, seen][:, :, order], where[seen][order], None

    def _still_seen(self, kpos: torch.Tensor) -> torch.Tensor:
        """Sinks: the sink tokens and the last W - 1 positions (the next query, at `start`, makes W);
        Self-Extend: every key."""
        if isinstance(self.scheme, Sinks):
            return (kpos < self.scheme.sinks) | (kpos > self.start - self.scheme.window)
        return torch.ones_like(kpos, dtype=torch.bool)


def _with_cached_attention(model: Decoder, scheme) -> Decoder:
    """A shallow copy of `model` (the same weights, whatever their format) whose blocks attend
    through CachedGroupedAttention; `model` itself is left as it was."""
    cfg = model.cfg
    if cfg.rope_scaling is not None or set(cfg.layer_kinds) != {"full"} or cfg.position != "rope":
        raise ValueError("self-extend and sinks run models with plain RoPE on full-attention layers only "
                         "(no rope scaling, no sliding-window layers)")
    clone = copy.copy(model)
    clone._modules = dict(model._modules)
    layers = nn.ModuleList()
    for layer in model.layers:
        twin = copy.copy(layer)
        twin._modules = dict(layer._modules)
        twin.attn = CachedGroupedAttention(layer.attn, scheme)
        layers.append(twin)
    clone.layers = layers
    return clone


class GroupedEngine:
    """The engine interface (runtime/engine.py) over CachedGroupedAttention: batch 1, eager.
    `unbounded`: a generation may run past any context (sinks); Self-Extend is bounded by the
    model's context (cfg.max_seq_len, which --ctx-size sets), as every engine is (request.check_request)."""

    def __init__(self, model: Decoder, scheme: Sinks | SelfExtend, weights: str = ""):
        self.model, self.scheme, self.weights = _with_cached_attention(model, scheme), scheme, weights
        self.cfg = model.cfg
        self.device = next(model.parameters()).device
        self.unbounded = isinstance(scheme, Sinks)
        self.attentions = [layer.attn for layer in self.model.layers]

    def prepare(self, total_tokens: int) -> None:
        pass  # nothing to allocate: the cache grows to its bound

    def covers(self, total_tokens: int) -> bool:
        return True

    def describe(self) -> str:
        s = self.scheme
        how = (f"attention sinks: {s.sinks} first tokens + the last {s.window}" if isinstance(s, Sinks)
               else f"Self-Extend: groups of {s.group} past a window of {s.window}")
        return f"{self.weights + '; ' if self.weights else ''}eager, {how}"

    @property
    def kept(self) -> int:
        """Keys each layer's cache holds now (the bound the tests assert)."""
        return self.attentions[0].kept

    def prefill(self, ids: torch.Tensor) -> torch.Tensor:
        for attn in self.attentions:
            attn.reset()
        return self.model(ids, last_only=True)[:, -1]  # (1, V)

    def step(self, ids: torch.Tensor, pos: int) -> torch.Tensor:
        if pos != self.attentions[0].start:
            raise ValueError(f"step at position {pos}, but the cache's next position is {self.attentions[0].start}")
        return self.model(ids, last_only=True)[:, -1]

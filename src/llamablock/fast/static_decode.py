"""A decoder reshaped for speed: fused weights, a static KV cache, one compiled decode step.

Decoding one token is a few hundred small ops; eager PyTorch pays a Python call and a
dispatch for each (the q8 profile in BENCHMARKS.md: a third of the step was op launches). The
same model, rearranged so that torch.compile can turn the whole step into a few kernels:

  * fused weights: W_q, W_k, W_v become one (h + 2 n_kv) d_head x d matrix and W_gate, W_up one
    2 d_ff x d matrix (gpt-fast's `wqkv` and litgpt's fused `qkv`): the same bytes read by two
    matmuls instead of five;
  * a static cache: per-layer buffers (b, n_kv, L, d) of one fixed length L. A step writes its
    key and value at slot `pos` and attends over all L slots with the slots after `pos` masked,
    so every step has the same shapes and one compiled graph serves them all. L is rounded up
    to a power of two (`cache_length`), so a few graphs cover every request and reading the
    unused slots costs at most the used ones again;
  * cos/sin of every position 0..L-1 computed once (llamablock.rope), looked up per step;
  * `step` has no checks and no Python branching on values, so it compiles to one graph
    (llamablock.fast.compiled_decode: AOTInductor or torch.compile, with freezing).

Prefill (t > 1 tokens) runs through the same fused layers from an empty cache, attention by
scaled_dot_product_attention over the t tokens only, and fills the cache's first t slots. It has
no branch on t, so one program compiled with t symbolic serves every prompt length
(llamablock.fast.compiled_decode), and it returns the logits of a position it is given, so that a
caller may pad a prompt at its end.
Equality with `llamablock.model.Decoder`: the same operations on the same numbers, except that
attention's softmax sums over L slots (zeros past `pos`) and the fused matmuls may block their
sums differently, so logits agree to float rounding, not bit for bit (tests state the tolerance).
Scope: the decode step of RoPE models with frequencies fixed for the whole sequence, pre-LN
(every LLaMA-family checkpoint). `unsupported_reason` names what is not covered (ALiBi, learned
positions, post-LN, dynamic NTK and longrope, whose frequencies change with the length);
those run on the eager Decoder.
Shapes: b batch, t new tokens, L cache slots, h query heads, n_kv kv heads, g = h / n_kv, d head width.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from llamablock.attention import allowed_slots
from llamablock.ffn import GatedFFN, gate_activation
from llamablock.rope import apply_rope, rope_cos_sin
from llamablock.rope_scaling import rotates_cached_keys

MIN_CACHE = 256  # the smallest static cache length (slots)


def cache_length(tokens: int, max_seq_len: int) -> int:
    """The static cache length for `tokens` slots: the next power of two from MIN_CACHE on,
    capped at the model's context. Few distinct lengths means few compiled graphs."""
    if tokens > max_seq_len:
        raise ValueError(f"{tokens} tokens exceed the model's context of {max_seq_len}")
    length = MIN_CACHE
    while length < tokens:
        length *= 2
    return min(length, max_seq_len)


def unsupported_reason(cfg) -> str | None:
    """Why this config cannot use the static decoder, or None when it can."""
    if cfg.position != "rope":
        return f"position {cfg.position!r} (the static decoder implements RoPE only)"
    if rotates_cached_keys(cfg):
        return "RoPE frequencies that change with the sequence length (dynamic NTK, longrope)"
    if cfg.norm_placement != "pre":
        return "post-LN blocks (the static decoder implements pre-LN)"
    return None


def _fused_linear(parts: list[nn.Linear]) -> nn.Linear:
    """One Linear whose output rows are `parts`' rows, in order."""
    weight = torch.cat([p.weight.detach() for p in parts])  # (sum of outs, in)
    fused = nn.Linear(weight.shape[1], weight.shape[0], bias=parts[0].bias is not None,
                      device=weight.device, dtype=weight.dtype)
    fused.weight = nn.Parameter(weight, requires_grad=False)
    if parts[0].bias is not None:
        fused.bias = nn.Parameter(torch.cat([p.bias.detach() for p in parts]), requires_grad=False)
    return fused


class _Layer(nn.Module):
    """One pre-LN block with fused q/k/v and gate/up weights and its own static cache."""

    def __init__(self, block, cfg, batch: int, length: int, dtype: torch.dtype):
        super().__init__()
        attn = block.attn
        self.h, self.n_kv, self.d = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
        self.layout, self.window = cfg.rope_layout, cfg.sliding_window
        self.norm1, self.norm2 = block.norm1, block.norm2
        self.wqkv = _fused_linear([attn.wq, attn.wk, attn.wv])
        self.wo = attn.wo
        if isinstance(block.ffn, GatedFFN):
            self.act = block.ffn.act
            self.w_gate_up = _fused_linear([block.ffn.w_gate, block.ffn.w_up])
            self.w_down = block.ffn.w_down
        else:  # the 2017 MLP: already two matmuls
            self.act, self.mlp = None, block.ffn
        shape = (batch, self.n_kv, length, self.d)  # (b, n_kv, L, d)
        # Separate buffers per layer: one shared buffer made compiled graphs copy all of it per layer.
        self.register_buffer("k_cache", torch.zeros(shape, dtype=dtype), persistent=False)
        self.register_buffer("v_cache", torch.zeros(shape, dtype=dtype), persistent=False)

    def _ffn(self, x: torch.Tensor) -> torch.Tensor:
        if self.act is None:
            return self.mlp(x)
        gate, up = self.w_gate_up(x).chunk(2, dim=-1)  # (b, t, d_ff) each
        return self.w_down(gate_activation(gate, self.act) * up)

    def _qkv(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        b, t, _ = x.shape
        q, k, v = self.wqkv(x).split((self.h * self.d, self.n_kv * self.d, self.n_kv * self.d), dim=-1)
        q = apply_rope(q.view(b, t, self.h, self.d).transpose(1, 2), cos, sin, self.layout)  # (b, h, t, d)
        k = apply_rope(k.view(b, t, self.n_kv, self.d).transpose(1, 2), cos, sin, self.layout)  # (b, n_kv, t, d)
        return q, k, v.view(b, t, self.n_kv, self.d).transpose(1, 2)

    def prefill(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """x (b, t, d) at positions 0..t-1: fill slots 0..t-1 and return the block's output."""
        b, t, _ = x.shape
        q, k, v = self._qkv(self.norm1(x), cos, sin)
        self.k_cache[:, :, :t] = k
        self.v_cache[:, :, :t] = v
        if self.window is None:
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=self.n_kv != self.h)
        else:  # the window's mask at every length: a branch on t > window would fix t in a compiled program
            slot = torch.arange(t, device=x.device)
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed_slots(slot, slot, self.window),
                                                 enable_gqa=self.n_kv != self.h)
        x = x + self.wo(out.transpose(1, 2).reshape(b, t, self.h * self.d))
        return x + self._ffn(self.norm2(x))

    def step(self, x: torch.Tensor, pos: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
             allowed: torch.Tensor) -> torch.Tensor:
        """x (b, 1, d) at position pos (1,); allowed (1, L) bool: the slots this token may see."""
        b = x.shape[0]
        q, k, v = self._qkv(self.norm1(x), cos, sin)
        self.k_cache.index_copy_(2, pos, k)  # in place: the compiled graph writes one slot
        self.v_cache.index_copy_(2, pos, v)
        g = self.h // self.n_kv
        qg = q.reshape(b, self.n_kv, g, self.d)  # a group's query heads stacked, as llamablock.attention
        # Scores and output as products and sums, not matmuls: inductor's GEMM templates (the
        # bfloat16, q8 and q4 steps) copied and repacked all L keys and values into their own layout
        # at every step and layer; a sum reads the cache where it is. SmolLM2's steps side by side
        # here: q8 1.27x then 1.07-1.12x for the output, bfloat16 1.29x then 1.09x, float32 (MKL's
        # batched matmul before) 1.07x then 1.13x. In float32, as a matmul accumulates.
        scores = (qg.float()[:, :, :, None] * self.k_cache.float()[:, :, None]).sum(-1)  # (b, n_kv, g, L)
        scores = (scores * self.d**-0.5).masked_fill(~allowed, float("-inf"))
        probs = torch.softmax(scores, dim=-1)  # (b, n_kv, g, L) float32
        out = (probs[..., None] * self.v_cache.float()[:, :, None]).sum(-2)  # (b, n_kv, g, d)
        out = out.to(q.dtype).reshape(b, 1, self.h * self.d)  # (b, 1, h d)
        x = x + self.wo(out)
        return x + self._ffn(self.norm2(x))


class StaticDecoder(nn.Module):
    """`model`'s weights in the static layout, with a cache of `length` slots for `batch` rows.

    The fused matrices are new tensors; the norms, output projections, embedding and head are
    shared with `model` (no copy). `step` is the function to compile (llamablock.fast.compiled_decode).
    """

    def __init__(self, model, length: int, batch: int = 1):
        super().__init__()
        cfg = model.cfg
        reason = unsupported_reason(cfg)
        if reason is not None:
            raise ValueError(f"the static decoder does not support {reason}; use the eager model")
        if not 0 < length <= cfg.max_seq_len:
            raise ValueError(f"cache length must be in 1..{cfg.max_seq_len}, got {length}")
        dtype = model.embed.weight.dtype
        self.cfg, self.length, self.batch = cfg, length, batch
        self.embed, self.final_norm, self.head = model.embed, model.final_norm, model.head
        self.layers = nn.ModuleList(_Layer(block, cfg, batch, length, dtype) for block in model.layers)
        positions = torch.arange(length)[None]  # (1, L)
        cos, sin = rope_cos_sin(cfg, positions, dtype, seq_len=length)  # (1, L, r/2)
        self.register_buffer("cos", cos[0], persistent=False)  # (L, r/2)
        self.register_buffer("sin", sin[0], persistent=False)
        self.register_buffer("slots", torch.arange(length), persistent=False)  # (L,)
        self.scale = None if cfg.embed_scale is None else torch.tensor(cfg.embed_scale, dtype=dtype)

    def _embed(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(ids)  # (b, t, d)
        return x if self.scale is None else x * self.scale  # Gemma: scale rounded to the dtype first

    def _logits(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.final_norm(x[:, -1]))  # (b, vocab)

    @torch.no_grad()
    def prefill(self, ids: torch.Tensor, last: torch.Tensor | None = None) -> torch.Tensor:
        """ids (b, t) at positions 0..t-1 -> logits (b, vocab) of position `last` (a (1,) long
        tensor; default t - 1); fills the cache's first t slots.

        A caller that pads the prompt at its end names its last real token: the causal mask keeps
        the padding out of every real position, and each decode step overwrites the padding's
        slot before it reads it (slots after the step's position are masked).
        """
        b, t = ids.shape
        if b != self.batch or not 0 < t <= self.length:
            raise ValueError(f"prefill takes ({self.batch}, 1..{self.length}) token ids, got {tuple(ids.shape)}")
        x = self._embed(ids)
        cos, sin = self.cos[None, :t], self.sin[None, :t]  # (1, t, r/2)
        for layer in self.layers:
            x = layer.prefill(x, cos, sin)
        return self._logits(x if last is None else x.index_select(1, last))

    def step(self, ids: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        """ids (b, 1) at position pos (a (1,) long tensor, slots before it filled) -> logits (b, vocab).

        No checks and no Python-side branching on values here: this is the compiled graph.
        """
        x = self._embed(ids)
        cos, sin = self.cos[pos][None], self.sin[pos][None]  # (1, 1, r/2)
        allowed = allowed_slots(pos, self.slots, self.cfg.sliding_window)  # (1, L)
        for layer in self.layers:
            x = layer.step(x, pos, cos, sin, allowed)
        return self._logits(x)

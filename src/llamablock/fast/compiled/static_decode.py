"""The Decoder transformed for speed: fused weights, a static KV cache, one compilable decode step.

Decoding one token is a few hundred small ops; eager PyTorch pays a Python call and a dispatch
for each (`llamablock bench decode` profiles the eager step). The same model, rearranged so
that a compiler can turn the whole step into a few kernels:

  * fused weights: W_q, W_k, W_v become one (h + 2 n_kv) hd x D matrix and W_gate, W_up one
    2 d_ff x D matrix (gpt-fast's `wqkv` and litgpt's fused `qkv`): the same bytes read by two
    matmuls instead of five;
  * a static cache (llamablock.kv_cache.StaticKVCache): per-layer buffers of one fixed length L.
    A step writes its key and value at slot `pos` and attends over the filled slots 0..pos only
    (`filled`: a slice whose length is a symbol of the traced program, so one compiled graph
    serves every position; in a batch, up to the longest row's position, a shorter row masking
    the slots after its own). L is rounded up to a power of two (`cache_length`), so a few
    graphs cover every request;
  * cos/sin of every position 0..L-1 computed once by the model's `Rotary`, looked up per step;
  * `step` has no checks and no Python branching on values, so it compiles to one graph
    (llamablock.fast.compiled.static_engine).
Everything else is the block's own: its norms, output projections, down projection, activation,
RoPE rotation, embedding and head are shared with the Decoder, not copied.

Prefill (t > 1 tokens) runs through the same fused layers from an empty cache, attention by
scaled_dot_product_attention over the t tokens only (with `in_place`, the kernel's operator,
which takes the eager engine's chunks where they cover t: fast/kernels/prompt_attention.py), and
fills the cache's first t slots. It has no branch on t, so one program compiled with t symbolic
serves every prompt length, and it returns the logits of a position it is given, so that a caller
may pad a prompt at its end.
Equality with `llamablock.model.Decoder`: the same operations on the same numbers, except that
the step's softmax sums over the filled slots (in a batch, zeros past a shorter row's `pos`) and the fused matmuls may block their
sums differently, so logits agree to float rounding, not bit for bit (tests state the tolerance).
Scope: RoPE models with frequencies fixed for the whole sequence, pre-LN (every LLaMA-family
checkpoint). `unsupported_reason` names what is not covered; those run on the eager Decoder.
Shapes: the package legend (llamablock/__init__.py).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from llamablock.attention import allowed_slots
from llamablock.fast.kernels.prompt_attention import CHUNK, FROM, UP_TO
from llamablock.ffn import GatedFFN, gate_activation
from llamablock.kv_cache import StaticKVCache
from llamablock.rope_scaling import follows_length

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
    if follows_length(cfg):
        return "RoPE frequencies that change with the sequence length (dynamic NTK, longrope)"
    if cfg.norm_placement != "pre":
        return "post-LN blocks (the static decoder implements pre-LN)"
    descendants = [name for name, on in (
        ("q/k norms", cfg.qk_norm), ("sandwich norms", cfg.sandwich_norm),
        ("soft-capping", cfg.attn_softcap is not None or cfg.final_softcap is not None),
        ("query_pre_attn_scalar", cfg.query_pre_attn_scalar is not None),
        ("mixed local and global layers", len(set(cfg.layer_kinds)) > 1)) if on]
    if descendants:
        return f"{', '.join(descendants)} (the static decoder implements the LLaMA block; these run eagerly)"
    return None


def filled(pos: torch.Tensor, length: int):
    """The slots a step reads: 0 .. max(pos), the longest row's filled part, out of `length`.

    A size that depends on a tensor's value: `.item()` makes it a symbol in a traced program (an
    unbacked SymInt of torch.export; torch.compile needs dynamo's capture_scalar_outputs), and the
    bounds given by torch._check let the slices `[:n]` of the cache be traced without a guard, so one
    program serves every position and reads n slots, not L. A program per length bucket would be
    the alternative where a slice cannot be exported.
    """
    n = pos.max().item() + 1
    torch._check(n >= 1)
    torch._check(n <= length)
    return n


class Concatenated(nn.Module):
    """Layers that cannot share one matrix (a file's blocks of different types), outputs side by side."""

    def __init__(self, parts: list[nn.Module]):
        super().__init__()
        self.parts = nn.ModuleList(parts)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([p(x) for p in self.parts], dim=-1)


def fuse_linears(parts: list[nn.Module]) -> nn.Module:
    """One layer whose output rows are `parts`' rows, in order (new tensors, no gradient): a Linear,
    or a BlockLinear of the file's blocks, whose rows are whole rows of blocks, when they share a type."""
    from llamablock.fast.kernels.file_blocks import BlockLinear

    if any(isinstance(p, BlockLinear) for p in parts):
        if len({getattr(p, "type_name", None) for p in parts}) > 1:
            return Concatenated(parts)
        bias = None if parts[0].bias is None else torch.cat([p.bias for p in parts])
        kind, k, binding = parts[0].type_name, parts[0].in_features, parts[0].binding  # the plan's, kept
        if len({p.grouped for p in parts}) == 1:  # whole rows (groups of 8 rows): their bytes join as they are
            fused = BlockLinear(kind, torch.cat([p.blocks for p in parts]), k, bias, grouped=parts[0].grouped,
                                binding=binding)
            share_rows(fused, parts)
            return fused
        return BlockLinear(kind, torch.cat([p.file_rows() for p in parts]), k, bias, binding=binding)
    weight = torch.cat([p.weight.detach() for p in parts])  # (sum of outs, in)
    fused = nn.Linear(weight.shape[1], weight.shape[0], bias=parts[0].bias is not None,
                      device=weight.device, dtype=weight.dtype)
    fused.weight = nn.Parameter(weight, requires_grad=False)
    if parts[0].bias is not None:
        fused.bias = nn.Parameter(torch.cat([p.bias.detach() for p in parts]), requires_grad=False)
    return fused


def share_rows(fused, parts: list[nn.Module]) -> None:
    """Point each part's blocks at its rows of `fused` (views, the same bytes), so that the model
    and its static layout hold one copy of the fused matrices, not two: at 1B the fused q/k/v and
    gate/up are about two thirds of a layer's bytes (`llamablock bench size` measures the peak).
    The model computes what it did: the bytes are equal, and a part's rows (whole groups of 8 where
    grouped) are a contiguous slice of the fused tensor."""
    start = 0
    for part in parts:
        rows = part.blocks.shape[0]
        part.blocks = fused.blocks[start:start + rows]
        start += rows


class FusedGatedFFN(nn.Module):
    """A GatedFFN with W_gate and W_up stacked into one matrix: the same maths, one matmul fewer."""

    def __init__(self, ffn: GatedFFN):
        super().__init__()
        self.act = ffn.act
        self.w_gate_up = fuse_linears([ffn.w_gate, ffn.w_up])
        self.w_down = ffn.w_down

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.w_gate_up(x).chunk(2, dim=-1)  # (b, t, d_ff) each
        return self.w_down(gate_activation(gate, self.act) * up)


class _Layer(nn.Module):
    """One pre-LN block of the Decoder with fused q/k/v (and gate/up) weights."""

    def __init__(self, block, cfg, rotary):
        super().__init__()
        attn = block.attn
        self.index, self.rotary = attn.layer, rotary
        self.h, self.n_kv, self.hd = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
        self.window = cfg.sliding_window
        self.norm1, self.norm2 = block.norm1, block.norm2
        self.wqkv = fuse_linears([attn.wq, attn.wk, attn.wv])
        self.wo = attn.wo
        self.ffn = FusedGatedFFN(block.ffn) if isinstance(block.ffn, GatedFFN) else block.ffn

    def _qkv(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        b, t, _ = x.shape
        q, k, v = self.wqkv(x).split((self.h * self.hd, self.n_kv * self.hd, self.n_kv * self.hd), dim=-1)
        q = self.rotary.rotate(q.view(b, t, self.h, self.hd).transpose(1, 2), cos, sin)  # (b, h, t, hd)
        k = self.rotary.rotate(k.view(b, t, self.n_kv, self.hd).transpose(1, 2), cos, sin)  # (b, n_kv, t, hd)
        return q, k, v.view(b, t, self.n_kv, self.hd).transpose(1, 2)

    def prefill(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, cache: StaticKVCache,
                in_place: bool = False) -> torch.Tensor:
        """x (b, t, D) at positions 0..t-1: fill slots 0..t-1 and return the block's output. `in_place`: the
        kernel's operators are loaded, so attention runs through prompt_attention's (the eager engine's chunks)."""
        b, t, _ = x.shape
        q, k, v = self._qkv(self.norm1(x), cos, sin)
        cache.fill(self.index, k, v)
        # Attend to the slots just filled, as the steps will read them (a 16-bit cache's rounding): read
        # back from the buffers, since inductor drops a round trip k.to(kv).to(q.dtype) from a program.
        k, v = (buf[:, :, :t].to(q.dtype) for buf in (cache.keys[self.index], cache.values[self.index]))
        if self.window is None and in_place:  # the operator picks chunks or SDPA by t (and dtype)
            out = torch.ops.llamablock.prompt_attention(q, k, v, self.hd**-0.5, CHUNK, FROM, UP_TO)
        elif self.window is None:
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=self.n_kv != self.h)
        else:  # the window's mask at every length: a branch on t > window would fix t in a compiled program
            slot = torch.arange(t, device=x.device)
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed_slots(slot, slot, self.window),
                                                 enable_gqa=self.n_kv != self.h)
        x = x + self.wo(out.transpose(1, 2).reshape(b, t, self.h * self.hd))
        return x + self.ffn(self.norm2(x))

    def step(self, x: torch.Tensor, pos: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
             allowed: torch.Tensor, cache: StaticKVCache, in_place: bool = False) -> torch.Tensor:
        """x (b, 1, D) at position pos, (1,) shared or (b,) one per row; allowed (1 or b, 1, 1, n)
        bool: which of the first n slots (the filled ones) each row's token may see. `in_place`: the
        cache read by the kernel's operators (StaticDecoder's `in_place`), else by products and sums."""
        b = x.shape[0]
        q, k, v = self._qkv(self.norm1(x), cos, sin)
        keys, values = cache.write(self.index, pos, k, v)  # (b, n_kv, L, hd) each, written in place
        n = allowed.shape[-1]  # the filled slots read: n <= L (StaticDecoder.step)
        g = self.h // self.n_kv
        if in_place:  # fast/kernels/block_op.cpp: each row's first n slots, converted as they are read
            out = torch.ops.llamablock.cache_attention(q.reshape(b, self.h, self.hd).contiguous(), keys, values,
                                                       allowed, self.hd**-0.5)  # (b, h, hd) float32
            x = x + self.wo(out.to(q.dtype).reshape(b, 1, self.h * self.hd))
            return x + self.ffn(self.norm2(x))
        keys, values = keys[:, :, :n], values[:, :, :n]  # (b, n_kv, n, hd) each, views
        qg = q.reshape(b, self.n_kv, g, self.hd)  # a group's query heads stacked, as llamablock.attention
        # Scores and output as products and sums, not matmuls: inductor's GEMM templates (the
        # bfloat16, q8 and q4 steps) copy and repack all L keys and values into their own layout at
        # every step and layer, while a sum reads the cache where it is (`llamablock bench decode`).
        # In float32, as a matmul accumulates.
        scores = (qg.float()[:, :, :, None] * keys.float()[:, :, None]).sum(-1)  # (b, n_kv, g, n)
        scores = (scores * self.hd**-0.5).masked_fill(~allowed, float("-inf"))
        probs = torch.softmax(scores, dim=-1)  # (b, n_kv, g, n) float32
        out = (probs[..., None] * values.float()[:, :, None]).sum(-2)  # (b, n_kv, g, hd)
        out = out.to(q.dtype).reshape(b, 1, self.h * self.hd)  # (b, 1, h hd)
        x = x + self.wo(out)
        return x + self.ffn(self.norm2(x))


class StaticDecoder(nn.Module):
    """`model`'s weights in the static layout, with a cache of `length` slots for `batch` rows.

    The fused matrices are new tensors (over a file's blocks, the model's q/k/v and gate/up then view
    their rows: share_rows); the norms, output projections, embedding and head are shared with
    `model` (no copy); `layers` reuses another StaticDecoder's fused layers; the cache is kept in `kv_dtype` (default the model's dtype) and
    read upcast to float32, or with `in_place` by the kernel's operators (fast/kernels/block_op.py, loaded first),
    which convert each key and value as they read it, as the eager engine's reader does (cache_attention.py).
    `step` is the function to compile (llamablock.fast.compiled.static_engine);
    the cache is a plain attribute, not module state, so a compiled program can take it as input.
    """

    def __init__(self, model, length: int, batch: int = 1, kv_dtype: torch.dtype | None = None,
                 layers: nn.ModuleList | None = None, in_place: bool = False):
        super().__init__()
        cfg = model.cfg
        reason = unsupported_reason(cfg)
        if reason is not None:
            raise ValueError(f"the static decoder does not support {reason}; use the eager model")
        if not 0 < length <= cfg.max_seq_len:
            raise ValueError(f"cache length must be in 1..{cfg.max_seq_len}, got {length}")
        dtype = model.embed.weight.dtype
        self.cfg, self.length, self.batch = cfg, length, batch
        self.in_place = in_place  # steps read the cache through the kernel's operators (block_op.load() first)
        self.embed, self.final_norm, self.head = model.embed, model.final_norm, model.head
        # `layers`: another length's fused layers (they do not depend on the length), reused so that
        # a longer cache does not fuse, and hold, the weights again
        self.layers = layers if layers is not None else nn.ModuleList(_Layer(block, cfg, model.rotary)
                                                                      for block in model.layers)
        self.cache = StaticKVCache(cfg, batch, length, kv_dtype or dtype)
        cos, sin = model.rotary.cos_sin(torch.arange(length)[None], dtype, seq_len=length)  # (1, L, r/2)
        self.register_buffer("cos", cos[0], persistent=False)  # (L, r/2)
        self.register_buffer("sin", sin[0], persistent=False)
        self.register_buffer("slots", torch.arange(length), persistent=False)  # (L,)
        self.scale = None if cfg.embed_scale is None else torch.tensor(cfg.embed_scale, dtype=dtype)

    def _embed(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(ids)  # (b, t, D)
        return x if self.scale is None else x * self.scale  # Gemma: scale rounded to the dtype first

    def _logits(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.final_norm(x[:, -1]))  # (b, V)

    @torch.no_grad()
    def prefill(self, ids: torch.Tensor, last: torch.Tensor | None = None) -> torch.Tensor:
        """ids (b, t) at positions 0..t-1 -> logits (b, V) of position `last` (a (1,) long
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
            x = layer.prefill(x, cos, sin, self.cache, self.in_place)
        return self._logits(x if last is None else x.index_select(1, last))

    def step(self, ids: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        """ids (b, 1) at position pos -> logits (b, V): pos a (1,) long tensor, every row at that
        position, or (b,), row i at pos[i] (the rows of a batch of sequences, each its slots before
        its position filled; llamablock.fast.compiled.batch_compiled).

        No checks and no Python-side branching on values here: this is the compiled graph.
        """
        x = self._embed(ids)
        cos, sin = self.cos[pos][:, None], self.sin[pos][:, None]  # (1 or b, 1, r/2)
        n = filled(pos, self.length)
        allowed = allowed_slots(pos, self.slots[:n], self.cfg.sliding_window)[:, None, None]  # (1 or b, 1, 1, n)
        for layer in self.layers:
            x = layer.step(x, pos, cos, sin, allowed, self.cache, self.in_place)
        return self._logits(x)

"""Causal self-attention with grouped key-value heads (module sections 15.1, 15.2, 15.5).

One implementation covers all three head layouts: n_kv == h is MHA, n_kv == 1 is MQA, between
is GQA with g = h / n_kv query heads per key-value head. Keys and values are never copied out
to the query heads:
  * plain causal prefill: torch's scaled_dot_product_attention with enable_gqa=True, one fused
    call whose memory grows linearly with t (`llamablock bench long_prefill`), or where the plan
    gives a `prompt_reader` (the eager engine's) the same in chunks of queries (fast/kernels/prompt_attention.py);
  * decode (t == 1) and every masked case: the g query heads of a group are stacked along the
    sequence axis, q (b, n_kv, g*t, hd), and multiplied once against their key head
    (b, n_kv, hd, s): a grouped matmul that reads each cached key once per step (`llamablock
    bench attention` times it against SDPA's GQA path). A decode step may read more keys than it
    has, the rest masked: the cache pads them to a bucket where a CPU kernel library needs it
    (KVCache.bucketed, kv_cache.py). A 16-bit cache is read upcast, except by a layer the plan gave
    a `cache_reader` (the eager engine's: fast/kernels/cache_attention.py reads it in place).
The forward reads as project -> position -> cache -> attend. What every layer shares in one
forward pass (RoPE's cos/sin, the mask) is built once by the decoder (`attention_inputs`):
RoPE rotates q and k here; ALiBi is an additive bias in the mask; learned and sinusoidal
positions are added at the embeddings instead and do nothing here.
Masks use cache slots (token order), not position_ids, as transformers does: position_ids
only choose rotation angles, so they may start anywhere (e.g. offset into the thousands).
Shapes: the package legend (llamablock/__init__.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from llamablock.alibi import ALiBi
from llamablock.config import ModelConfig
from llamablock.kv_cache import Cache, pad_keys
from llamablock.norm import make_norm
from llamablock.rope import Rotary


def allowed_slots(q_slot: torch.Tensor, k_slot: torch.Tensor, window: int | None) -> torch.Tensor:
    """(t, s) bool: which cache slots each query slot may attend to. Causal, and with a sliding
    window the last `window` tokens only, the query's own included."""
    allowed = k_slot[None, :] <= q_slot[:, None]  # (t, s)
    if window is not None:
        allowed = allowed & (q_slot[:, None] - k_slot[None, :] < window)
    return allowed


@dataclass
class AttentionInputs:
    """What every attention layer reads in one forward pass, built once by `attention_inputs`.

    rope       (cos, sin), each (b, t, r/2): the new tokens' angles; None without RoPE
    key_rope   (cos, sin), each (b, s, r/2): every key's angles, when the cache holds keys
               before rotation (Rotary.late_keys); None otherwise
    bias       additive float32 (1 or h, t, s): causal order, sliding window, ALiBi; None when
               nothing is masked or when `causal` says SDPA applies the causal mask itself
    pad_bias   float32 (b, t, s): -inf on left padding (batched generation); None without padding
    causal     True for a plain causal prefill: SDPA's is_causal, no mask tensor built
    """

    rope: tuple[torch.Tensor, torch.Tensor] | None = None
    key_rope: tuple[torch.Tensor, torch.Tensor] | None = None
    bias: torch.Tensor | None = None
    pad_bias: torch.Tensor | None = None
    causal: bool = False


def attention_inputs(position_ids: torch.Tensor, start: int, *, dtype: torch.dtype, rotary: Rotary | None = None,
                     alibi: ALiBi | None = None, window: int | None = None,
                     pad_mask: torch.Tensor | None = None, key_slots: torch.Tensor | None = None,
                     fused_causal: bool = True) -> AttentionInputs:
    """The position and mask terms for new tokens at `position_ids` (b, t), after `start` cached ones.

    pad_mask (b, >= s) is True on real tokens, by cache slot (left-padded prompts batched together).
    key_slots (R,): the token index held by each cached key when the cache keeps only a window, in
    its ring's order (KVCache.key_slots); None when it holds tokens 0..start-1 in order.
    fused_causal=False builds a plain causal prefill's mask as a bias too, for attention that
    changes the scores before masking them (soft-capping), which SDPA's is_causal cannot take.
    """
    t = position_ids.shape[1]
    s = start + t
    device = position_ids.device
    cached = torch.arange(start, device=device) if key_slots is None else key_slots.to(device)
    q_slot = torch.arange(start, s, device=device)  # (t,)
    rope = key_rope = None
    if rotary is not None:
        # The length that length-dependent frequencies (dynamic NTK, LongRoPE) follow: the largest
        # position + 1, as transformers' dynamic_rope_update reads it; s, the number of keys, only
        # equals it when the positions start at 0. The others ignore it (no host read for them), and
        # on the meta device (shapes only) there is no value to read.
        length = int(position_ids.max()) + 1 if rotary.follows_length and position_ids.device.type != "meta" else s
        rope = rotary.cos_sin(position_ids, dtype, seq_len=length)
        if rotary.late_keys:
            # Key positions: the new tokens' own ids, after the cached ones, which continue the
            # new ones' numbering backwards (the cache keeps no positions).
            before = position_ids[:, :1] - start + cached  # (b, cached keys)
            key_rope = rotary.cos_sin(torch.cat((before, position_ids), dim=1), dtype, seq_len=length)
    n_keys = cached.shape[0] + t
    window_bites = window is not None and n_keys > window
    if fused_causal and t > 1 and start == 0 and alibi is None and not window_bites and pad_mask is None:
        return AttentionInputs(rope, key_rope, causal=True)
    if not (t > 1 or window_bites or alibi is not None or pad_mask is not None):
        return AttentionInputs(rope, key_rope)  # one new token, nothing to mask: the decode step
    k_slot = torch.cat((cached, q_slot)) if key_slots is not None else torch.arange(s, device=device)  # (keys,)
    bias = None
    if t > 1 or window_bites or alibi is not None:
        allowed = allowed_slots(q_slot, k_slot, window)  # (t, keys)
        bias = torch.zeros(allowed.shape, device=device).masked_fill(~allowed, float("-inf"))[None]  # (1, t, keys)
        if alibi is not None:
            bias = bias + alibi.bias(q_slot, k_slot)  # (h, t, keys)
    pad_bias = None
    if pad_mask is not None:
        # A query may always see its own slot, so a padding query's row is never all -inf (a NaN
        # there would reach real rows through 0 * NaN in probs @ v); padding rows are never read.
        real = pad_mask[:, :s] if key_slots is None else pad_mask[:, k_slot.clamp(min=0)]  # (b, keys)
        allowed = real[:, None, :] | (k_slot[None, None, :] == q_slot[None, :, None])  # (b, t, keys)
        pad_bias = torch.zeros(allowed.shape, dtype=torch.float32, device=device).masked_fill(~allowed, float("-inf"))
    return AttentionInputs(rope, key_rope, bias, pad_bias)


class Attention(nn.Module):
    """W_q, W_k, W_v, W_o around grouped attention; `rotary` (shared by the layers of its kind) or None.

    The descendants' options (config.py): q_norm/k_norm, RMSNorm over each head's hd features of
    q and k before RoPE (Qwen3, Gemma 3: bounds the scores' size whatever the projections learn);
    `scale`, query_pre_attn_scalar^-1/2 where set (Gemma); `softcap`, scores through c tanh(s / c)
    before the mask (Gemma 2). `kind` is "full" or "sliding": which of the forward's inputs it reads.
    """

    def __init__(self, cfg: ModelConfig, layer: int = 0, rotary: Rotary | None = None):
        super().__init__()
        self.layer, self.rotary = layer, rotary
        self.kind = cfg.layer_kinds[layer]
        self.h, self.n_kv, self.hd = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
        self.scale = (cfg.query_pre_attn_scalar or self.hd) ** -0.5
        self.query_scaled = cfg.query_pre_attn_scalar is not None  # else SDPA's own 1/sqrt(hd), as before
        self.softcap = cfg.attn_softcap
        self.wq = nn.Linear(cfg.d_model, self.h * self.hd, bias=cfg.qkv_bias)
        self.wk = nn.Linear(cfg.d_model, self.n_kv * self.hd, bias=cfg.qkv_bias)
        self.wv = nn.Linear(cfg.d_model, self.n_kv * self.hd, bias=cfg.qkv_bias)
        self.wo = nn.Linear(self.h * self.hd, cfg.d_model, bias=cfg.o_bias)
        if cfg.qk_norm:
            self.q_norm = make_norm(cfg.norm, self.hd, cfg.norm_eps, cfg.norm_offset)
            self.k_norm = make_norm(cfg.norm, self.hd, cfg.norm_eps, cfg.norm_offset)
        else:
            self.q_norm = self.k_norm = None
        # A decode step's attention read in place from a 16-bit cache, where the plan gives one
        # (fast/kernels/cache_attention.py, the eager engine's): else the cache is read upcast below.
        self.cache_reader = None
        # A prompt's causal attention in chunks, where the plan gives a reader (fast/kernels/prompt_attention.py, the
        # eager engine's): else torch's scaled_dot_product_attention below.
        self.prompt_reader = None

    def forward(self, x: torch.Tensor, inputs: AttentionInputs, cache: Cache | None = None) -> torch.Tensor:
        """x (b, t, D) -> (b, t, D)."""
        b, t, _ = x.shape
        q = self.wq(x).view(b, t, self.h, self.hd).transpose(1, 2)  # (b, h, t, hd)
        k = self.wk(x).view(b, t, self.n_kv, self.hd).transpose(1, 2)  # (b, n_kv, t, hd)
        v = self.wv(x).view(b, t, self.n_kv, self.hd).transpose(1, 2)  # (b, n_kv, t, hd)
        if self.q_norm is not None:  # over each head's hd features
            q, k = self.q_norm(q), self.k_norm(k)
        if inputs.rope is not None:
            q = self.rotary.rotate(q, *inputs.rope)
            if inputs.key_rope is None:
                k = self.rotary.rotate(k, *inputs.rope)
        keys = None
        if cache is not None:
            k, v = cache.update(self.layer, k, v)  # (b, n_kv, s, hd)
            if self.cache_reader is not None and self.cache_reader.covers(self, q, k, inputs):
                out = self.cache_reader(q, k, v, self.scale)  # (b, h, 1, hd)
                return self.wo(out.transpose(1, 2).reshape(b, t, self.h * self.hd))
            k, v = k.to(q.dtype), v.to(q.dtype)  # a 16-bit cache read upcast, to attend in q's dtype
            if t == 1 and inputs.key_rope is None:  # a decode step: keys padded to a bucket, maybe
                k, v, keys = cache.bucketed(self.layer, k, v)  # (b, n_kv, S >= s, hd)
        if inputs.key_rope is not None:  # keys cached before rotation: rotate all with today's angles
            k = self.rotary.rotate(k, *inputs.key_rope)
        out = self.attend(q, k, v, inputs, keys)  # (b, h, t, hd)
        return self.wo(out.transpose(1, 2).reshape(b, t, self.h * self.hd))

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, inputs: AttentionInputs,
               keys: int | None = None) -> torch.Tensor:
        """softmax(q k^T / sqrt(hd) + mask) v, grouped: q (b, h, t, hd), k and v (b, n_kv, s, hd).
        `keys`: how many of the s keys are real when k and v were padded to a bucket
        (KVCache.bucketed); the rest are masked out. The masks in `inputs` cover the real keys."""
        b, h, t, hd = q.shape
        s = k.shape[2]
        if inputs.causal:
            if self.softcap is not None:
                raise ValueError("soft-capped scores need the causal mask as a bias: build the inputs with "
                                 "attention_inputs(..., fused_causal=False), as the Decoder does")
            if self.prompt_reader is not None and self.prompt_reader.covers(q, k):
                return self.prompt_reader(q, k, v, self.scale)
            return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=self.n_kv != h,
                                                  scale=self.scale if self.query_scaled else None)
        g = h // self.n_kv
        qg = q.reshape(b, self.n_kv, g * t, hd)  # (b, n_kv, g*t, hd): a group's queries stacked
        scores = (qg @ k.transpose(-1, -2)) * self.scale  # (b, n_kv, g*t, s)
        if self.softcap is not None:  # Gemma 2: before the mask, as transformers' eager attention
            scores = torch.tanh(scores / self.softcap) * self.softcap
        if inputs.bias is not None:
            bias = pad_keys(inputs.bias.to(scores.dtype), s)
            scores = scores + bias.expand(h, t, s).reshape(self.n_kv, g * t, s)
        if inputs.pad_bias is not None:  # rows ordered (group member, token), as qg's
            scores = scores + pad_keys(inputs.pad_bias, s)[:, None].repeat(1, 1, g, 1)  # (b, 1, g*t, s)
        if keys is not None and keys < s:  # padding slots: weight exactly 0 after the softmax
            scores[..., keys:] = float("-inf")
        probs = torch.softmax(scores.float(), dim=-1).to(q.dtype)
        return (probs @ v).view(b, h, t, hd)  # (b, n_kv, g*t, hd) -> (b, h, t, hd)

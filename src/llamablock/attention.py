"""Causal self-attention with grouped key-value heads (module sections 15.1, 15.2, 15.5).

One implementation covers all three head layouts: n_kv == n_heads is MHA, n_kv == 1 is MQA,
between is GQA with g = n_heads / n_kv query heads per key-value head. Keys and values are
never copied out to the query heads:
  * prefill (t > 1): torch's scaled_dot_product_attention with enable_gqa=True, one fused call;
  * decode (t == 1) and every masked case: the g query heads of a group are stacked along the
    sequence axis, q (b, n_kv, g*t, d), and multiplied once against their key head
    (b, n_kv, d, s): a grouped matmul that reads each cached key once per step. On a CPU this
    beats SDPA's GQA path at decode (the speed issue measures it).
Positions: RoPE rotates q and k here; ALiBi adds its bias to the scores; learned and
sinusoidal positions are added at the embeddings instead and do nothing here.
Masks use cache slots (token order), not position_ids, as transformers does: position_ids
only choose rotation angles, so they may start anywhere (e.g. offset into the thousands).
Shapes: b batch, t new tokens, s tokens in cache, h query heads, n_kv kv heads, d head width.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from llamablock.alibi import alibi_bias, alibi_slopes
from llamablock.config import ModelConfig
from llamablock.kv_cache import KVCache
from llamablock.rope import apply_rope, rope_cos_sin
from llamablock.rope_scaling import rotates_cached_keys


def allowed_slots(q_slot: torch.Tensor, k_slot: torch.Tensor, window: int | None) -> torch.Tensor:
    """(t, s) bool: which cache slots each query slot may attend to. Causal, and with a sliding
    window the last `window` tokens only, the query's own included."""
    allowed = k_slot[None, :] <= q_slot[:, None]  # (t, s)
    if window is not None:
        allowed = allowed & (q_slot[:, None] - k_slot[None, :] < window)
    return allowed


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int = 0):
        super().__init__()
        self.cfg = cfg
        self.layer = layer
        self.n_heads, self.n_kv, self.d = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
        self.wq = nn.Linear(cfg.d_model, self.n_heads * self.d, bias=cfg.qkv_bias)
        self.wk = nn.Linear(cfg.d_model, self.n_kv * self.d, bias=cfg.qkv_bias)
        self.wv = nn.Linear(cfg.d_model, self.n_kv * self.d, bias=cfg.qkv_bias)
        self.wo = nn.Linear(self.n_heads * self.d, cfg.d_model, bias=cfg.o_bias)
        if cfg.position == "alibi":
            self.register_buffer("alibi_slopes", alibi_slopes(self.n_heads), persistent=False)

    def forward(self, x: torch.Tensor, position_ids: torch.Tensor, cache: KVCache | None = None,
                pad_mask: torch.Tensor | None = None, rope_cs: tuple | None = None) -> torch.Tensor:
        """rope_cs: (cos, sin) for these position_ids, computed once per forward by the Decoder
        (the same for every layer); None computes them here."""
        b, t, _ = x.shape
        q = self.wq(x).view(b, t, self.n_heads, self.d).transpose(1, 2)  # (b, h, t, d)
        k = self.wk(x).view(b, t, self.n_kv, self.d).transpose(1, 2)  # (b, n_kv, t, d)
        v = self.wv(x).view(b, t, self.n_kv, self.d).transpose(1, 2)  # (b, n_kv, t, d)
        start = cache.length if cache is not None else 0
        rope = self.cfg.position == "rope"
        late_keys = rope and rotates_cached_keys(self.cfg)  # dynamic NTK: cache keys unrotated
        if rope:
            cos, sin = rope_cs if rope_cs is not None else rope_cos_sin(self.cfg, position_ids, q.dtype, seq_len=start + t)
            q = apply_rope(q, cos, sin, self.cfg.rope_layout)
            if not late_keys:
                k = apply_rope(k, cos, sin, self.cfg.rope_layout)
        if cache is not None:
            k, v = cache.update(self.layer, k, v)  # (b, n_kv, s, d), s = start + t
        if late_keys:
            k = self._rotate_all_keys(k, position_ids, start)
        out = self._attend(q, k, v, start, pad_mask)  # (b, h, t, d)
        return self.wo(out.transpose(1, 2).reshape(b, t, self.n_heads * self.d))

    def _rotate_all_keys(self, k: torch.Tensor, position_ids: torch.Tensor, start: int) -> torch.Tensor:
        # Key positions: the new tokens' own ids, after the cached ones, which continue the
        # new ones' numbering backwards (the cache keeps no positions).
        s = k.shape[2]
        before = position_ids[:, :1] - start + torch.arange(start, device=k.device)  # (b, start)
        key_pos = torch.cat((before, position_ids), dim=1)  # (b, s)
        cos, sin = rope_cos_sin(self.cfg, key_pos, k.dtype, seq_len=s)
        return apply_rope(k, cos, sin, self.cfg.rope_layout)

    def _mask(self, t: int, s: int, start: int, device) -> torch.Tensor | None:
        """Additive bias (h or 1, t, s) for causal order, sliding window and ALiBi, or None."""
        window = self.cfg.sliding_window
        alibi = self.cfg.position == "alibi"
        needs_causal = t > 1
        needs_window = window is not None and s > window
        if not (needs_causal or needs_window or alibi):
            return None
        q_slot = torch.arange(start, start + t, device=device)  # (t,)
        k_slot = torch.arange(s, device=device)  # (s,)
        allowed = allowed_slots(q_slot, k_slot, window)  # (t, s)
        bias = torch.zeros(t, s, device=device).masked_fill(~allowed, float("-inf"))[None]  # (1, t, s)
        if alibi:
            bias = bias + alibi_bias(self.alibi_slopes, q_slot, k_slot)  # (h, t, s)
        return bias

    def _attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, start: int,
                pad_mask: torch.Tensor | None = None) -> torch.Tensor:
        b, h, t, d = q.shape
        s = k.shape[2]
        window_bites = self.cfg.sliding_window is not None and s > self.cfg.sliding_window
        if t > 1 and start == 0 and self.cfg.position != "alibi" and not window_bites and pad_mask is None:
            # Plain causal prefill: one fused call, memory linear in t (no (t, s) mask or score matrix
            # is built; bench long_prefill measures it); enable_gqa shares each kv head with its group.
            return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=self.n_kv != h)
        bias = self._mask(t, s, start, q.device)
        g = h // self.n_kv
        qg = q.reshape(b, self.n_kv, g * t, d)  # (b, n_kv, g*t, d): a group's queries stacked
        scores = (qg @ k.transpose(-1, -2)) * d**-0.5  # (b, n_kv, g*t, s)
        if bias is not None:
            bias = bias.to(scores.dtype).expand(h, t, s).reshape(self.n_kv, g * t, s)
            scores = scores + bias
        if pad_mask is not None:
            scores = scores + self._pad_bias(pad_mask, g, t, s, start)
        probs = torch.softmax(scores.float(), dim=-1).to(q.dtype)
        return (probs @ v).view(b, h, t, d)  # (b, n_kv, g*t, d) -> (b, h, t, d)

    @staticmethod
    def _pad_bias(pad_mask: torch.Tensor, g: int, t: int, s: int, start: int) -> torch.Tensor:
        """-inf on padding keys, (b, 1, g*t, s), for batches of left-padded prompts.

        pad_mask (b, >= s) is True on real tokens, by cache slot. A query may always see its own
        slot, so a padding query's row is never all -inf (a NaN there would reach real rows
        through 0 * NaN in probs @ v); what padding rows compute is never read.
        """
        q_slot = torch.arange(start, start + t, device=pad_mask.device)  # (t,)
        k_slot = torch.arange(s, device=pad_mask.device)  # (s,)
        allowed = pad_mask[:, None, :s] | (k_slot[None, None, :] == q_slot[None, :, None])  # (b, t, s)
        bias = torch.zeros(allowed.shape, dtype=torch.float32, device=pad_mask.device).masked_fill(~allowed, float("-inf"))
        return bias[:, None].repeat(1, 1, g, 1)  # (b, 1, g*t, s): rows ordered (group member, token)

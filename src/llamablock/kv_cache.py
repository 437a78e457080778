"""The two KV-cache designs of generation, holding only the key-value heads (module section 15.5).

Per layer, keys and values of shape (b, n_kv, L, hd): with grouped-query attention the cache is
h / n_kv times smaller than with MHA, because query heads that share a key-value head share its
cached entries; nothing is expanded to the query heads.
Size: 2 x layers x n_kv x hd x L x bytes per element, times the batch.

    KVCache        grows by appending: `update` stores the new tokens after the `length` already
                   there and returns the filled part, (b, n_kv, s, hd). The eager Decoder's cache.
                   A sliding-window layer (Mistral; Gemma's local layers) attends only to its last
                   W tokens, so its buffer is a ring of W slots: token i lives in slot i mod W, and
                   `update` returns the ring's tokens and the new ones, (b, n_kv, W + t, hd), for
                   the mask to cut to the window (`key_slots` says which token each slot holds).
                   Mistral's rolling buffer (Jiang et al., 2023); the calculator counts the same W.
    StaticKVCache  one fixed length L, written at a position: `write` stores one token in slot
                   `pos` in place and returns all L slots, the unfilled ones for the caller to mask.
                   Every decode step then has the same shapes, so one compiled program serves every
                   position (llamablock.fast.compiled.static_decode).

Both keep one pair of buffers per layer: a single buffer shared by all layers makes a compiled
decode step copy the whole cache at every layer.

`Cache` is what the attention (llamablock.attention) and the Decoder (llamablock.model) read and
write of a cache: `length`, `update`, `bucketed`, `key_slots`, `advance`. KVCache satisfies it, and
so does the server's batched cache (llamablock.runtime.batch.BatchKVCache);
tests/components/test_cache_protocol.py checks every cache class of the package against it.
StaticKVCache is not one: the static layout's own layers write it (fast/compiled/static_decode.py).

A CPU workaround lives here too, beside the buffers it reads: in bfloat16 and float16 a decode
step's keys are padded to a multiple of KEY_BUCKET slots (`KVCache.bucketed`), because oneDNN
keeps a kernel for every shape it has run; the attention masks the padding (`pad_keys`).
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import torch
import torch.nn.functional as F

from llamablock.config import ModelConfig

# A reduced-precision CPU decode step pads its keys to a multiple of this many slots (KVCache.bucketed).
# Why 256: a step then reads at most 255 keys more per layer, which cost less than building a
# new pair of oneDNN kernels at every step did (timed side by side when it was chosen; the commit
# that introduced it has the figures; no benchmark repeats that comparison), while an
# 8,192-token context builds 32 pairs in all.
KEY_BUCKET = 256
_ONEDNN_DTYPES = (torch.bfloat16, torch.float16)  # CPU bmm by oneDNN (BMM_LIBRARY, benchmarks/bench_attention.py)


def cache_bytes(cfg: ModelConfig, tokens: int, batch: int = 1, value_bytes: int = 2, n_kv: int | None = None) -> int:
    """Bytes of keys and values that `tokens` tokens take in every layer of `cfg` (n_kv heads, default
    the model's), `value_bytes` per element: a sliding-window layer keeps at most its window, as
    KVCache's ring does. The calculator (diagnostics/kv_calculator.py) reports this total."""
    n_kv = cfg.n_kv_heads if n_kv is None else n_kv
    kept = min(tokens, cfg.sliding_window) if "sliding" in cfg.layer_kinds else tokens
    per_token_layer = 2 * n_kv * cfg.head_dim * value_bytes
    return sum(per_token_layer * (kept if kind == "sliding" else tokens) * batch for kind in cfg.layer_kinds)


@runtime_checkable
class Cache(Protocol):
    """What a layer's attention and the Decoder use of a KV cache (KVCache's methods say what each does)."""

    length: int  # tokens already stored (a batch's frontier): new tokens go after them

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]: ...

    def bucketed(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, int | None]: ...

    def key_slots(self) -> torch.Tensor | None: ...

    def advance(self, t: int) -> None: ...


def _buffers(cfg: ModelConfig, batch_size: int, length: int, dtype, device,
             lengths: list[int] | None = None) -> list[torch.Tensor]:
    if batch_size <= 0 or length <= 0:
        raise ValueError(f"batch_size and the cache length must be positive, got {batch_size}, {length}")
    lengths = lengths or [length] * cfg.n_layers
    # (b, n_kv, L, hd) per layer
    return [torch.zeros(batch_size, cfg.n_kv_heads, n, cfg.head_dim, dtype=dtype, device=device) for n in lengths]


class KVCache:
    def __init__(self, cfg: ModelConfig, batch_size: int, max_len: int | None = None,
                 dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu"):
        self.max_len = max_len or cfg.max_seq_len
        # A ring only where the window is shorter than the cache: otherwise nothing ever leaves it.
        window = cfg.sliding_window
        self.ring = window if window is not None and window < self.max_len else None  # W slots, or no ring
        self.in_ring = [kind == "sliding" and self.ring is not None for kind in cfg.layer_kinds]
        lengths = [self.ring if r else self.max_len for r in self.in_ring]
        self.keys = _buffers(cfg, batch_size, self.max_len, dtype, device, lengths)
        self.values = _buffers(cfg, batch_size, self.max_len, dtype, device, lengths)
        self.length = 0  # tokens already stored, the same for every layer

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Store k, v (b, n_kv, t, hd) at [length, length + t); return all keys and values so far
        (a ring layer: the ring's, then the new ones)."""
        start, end = self.length, self.length + k.shape[2]
        if end > self.max_len:
            raise ValueError(f"KV cache is full: {end} tokens requested, room for {self.max_len}")
        if self.in_ring[layer]:
            return self._ring_update(layer, k, v)
        self.keys[layer][:, :, start:end] = k
        self.values[layer][:, :, start:end] = v
        return self.keys[layer][:, :, :end], self.values[layer][:, :, :end]

    def _ring_update(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        start, t, w = self.length, k.shape[2], self.ring
        # rounded to the cache's dtype first, as `update` returns them (a 16-bit cache): index_copy_ takes no other
        k, v = k.to(self.keys[layer].dtype), v.to(self.values[layer].dtype)
        held = min(start, w)  # before the ring wraps, slots 0..start-1 hold tokens 0..start-1 in order
        keys = torch.cat((self.keys[layer][:, :, :held], k), dim=2)  # (b, n_kv, held + t, hd)
        values = torch.cat((self.values[layer][:, :, :held], v), dim=2)
        keep = min(t, w)  # the last W new tokens go to their slots, token i to slot i mod W
        slots = torch.arange(start + t - keep, start + t, device=k.device) % w
        self.keys[layer].index_copy_(2, slots, k[:, :, t - keep:])
        self.values[layer].index_copy_(2, slots, v[:, :, t - keep:])
        return keys, values

    def bucketed(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, int | None]:
        """k, v (b, n_kv, s, hd), as `update` returned them for one new token -> (k, v, keys):
        where the layer's buffers hold the same s keys in their first s slots, those buffers' first S
        slots instead, S = s rounded up to KEY_BUCKET (at most the buffer's length), and keys = s,
        for the attention to mask the rest; else k, v as given and None.

        Why: on the CPU, torch runs bfloat16 and float16 batched matmuls with oneDNN, which builds a
        kernel for every new shape and keeps it for the life of the process, whatever
        ONEDNN_PRIMITIVE_CACHE_CAPACITY says (its brgemm kernels outlive the primitive cache, as in
        uxlfoundation/oneDNN#1757). Unpadded, a decode step's two attention matmuls have a new key
        length at every token: the heap grew with every generated token, and each step paid for
        building two kernels. Padded, a whole context builds context / KEY_BUCKET pairs (plus a pair
        per buffer length), and a step reads at most KEY_BUCKET - 1 slots more. The unfilled slots
        hold zeros or an older sequence's (finite) values; their weight after the softmax is exactly
        0, so the output is the unpadded one bit for bit (tests/components/test_attention.py).
        Left as it is: a ring that has wrapped (its length is fixed at W + 1), keys rotated late (a
        new tensor each step), float32 (MKL keeps no kernel per shape), other devices.
        tests/runtime/test_generate.py measures the memory a generation adds; `llamablock bench
        decode` the speed.
        """
        if k.device.type != "cpu" or k.dtype not in _ONEDNN_DTYPES or self.keys[layer].dtype != k.dtype:
            return k, v, None  # (keys the attention cast from another cache dtype are not the buffers')
        buf_k, buf_v = self.keys[layer], self.values[layer]
        s = k.shape[2]
        padded = min(-(-s // KEY_BUCKET) * KEY_BUCKET, buf_k.shape[2])
        # A ring holds tokens 0..length in slots 0..length until it wraps (_ring_update); a full
        # layer's buffer always holds them there.
        in_order = self.length + 1 <= self.ring if self.in_ring[layer] else True
        if padded <= s or not in_order:
            return k, v, None
        return buf_k[:, :, :padded], buf_v[:, :, :padded], s

    def key_slots(self) -> torch.Tensor | None:
        """(W,) the token index each ring slot holds, once the ring has wrapped (the mask's key
        order for ring layers); None while slots 0..length-1 hold tokens 0..length-1, or without a ring."""
        if self.ring is None or self.length <= self.ring:
            return None
        last, w = self.length - 1, self.ring
        slot = torch.arange(w, device=self.keys[0].device)
        return last - (last - slot) % w  # the newest token i <= last with i mod W == slot

    def advance(self, t: int) -> None:
        """Called by the model once all layers have stored t new tokens."""
        self.length += t

    def grow(self, max_len: int) -> None:
        """Room for `max_len` tokens, keeping what is stored (new buffers, the filled part copied):
        a generation can start small and grow with what it actually produces."""
        if max_len <= self.max_len:
            return
        for buffers in (self.keys, self.values):
            for i, old in enumerate(buffers):
                if self.in_ring[i]:
                    continue  # a ring already holds all its window needs
                new = old.new_zeros(*old.shape[:2], max_len, old.shape[3])  # (b, n_kv, max_len, hd)
                new[:, :, :self.length] = old[:, :, :self.length]
                buffers[i] = new
        self.max_len = max_len

    def nbytes(self) -> int:
        """Bytes actually allocated by the buffers."""
        return sum(t.numel() * t.element_size() for t in self.keys + self.values)

    def reset(self) -> None:
        self.length = 0


def pad_keys(mask: torch.Tensor, s: int) -> torch.Tensor:
    """A mask (..., keys) widened to s keys with zeros, for keys padded by KVCache.bucketed (the
    attention masks the padding itself)."""
    return mask if mask.shape[-1] == s else F.pad(mask, (0, s - mask.shape[-1]))


class StaticKVCache:
    """L slots per layer, written in place at a position; the caller masks the slots not yet written."""

    def __init__(self, cfg: ModelConfig, batch_size: int, slots: int,
                 dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu"):
        self.slots = slots  # L, fixed (KVCache.length counts tokens stored; here every slot always exists)
        self.keys = _buffers(cfg, batch_size, slots, dtype, device)
        self.values = _buffers(cfg, batch_size, slots, dtype, device)

    def fill(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> None:
        """Store a prompt's k, v (b, n_kv, t, hd) in slots 0..t-1."""
        t = k.shape[2]
        self.keys[layer][:, :, :t] = k
        self.values[layer][:, :, :t] = v

    def write(self, layer: int, pos: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Store k, v (b, n_kv, 1, hd) in slot `pos`, a long tensor (so that a compiled step takes it
        as an input, not a constant): (1,), the same slot in every row, or (b,), row i's in slot
        pos[i]; return all L slots, (b, n_kv, L, hd) each."""
        k, v = k.to(self.keys[layer].dtype), v.to(self.values[layer].dtype)  # a 16-bit cache rounds them here
        if pos.shape[0] == 1:  # a shape, fixed in a compiled program: no branch on values
            self.keys[layer].index_copy_(2, pos, k)
            self.values[layer].index_copy_(2, pos, v)
        else:
            rows = torch.arange(k.shape[0], device=k.device)
            self.keys[layer][rows, :, pos] = k[:, :, 0]  # (b, n_kv, hd) into (b, n_kv, L, hd) at [i, :, pos[i]]
            self.values[layer][rows, :, pos] = v[:, :, 0]
        return self.keys[layer], self.values[layer]

    def tensors(self) -> list[torch.Tensor]:
        """k0, v0, k1, v1, ...: the order in which a compiled program takes them as inputs."""
        return [t for pair in zip(self.keys, self.values, strict=True) for t in pair]

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.keys + self.values)

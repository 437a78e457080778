"""A preallocated key-value cache holding only the key-value heads (module section 15.5).

Per layer, keys and values of shape (b, n_kv, max_len, d_head): with grouped-query attention
the cache is n_heads / n_kv times smaller than with MHA, because query heads that share a
key-value head share its cached entries; nothing is expanded to the query heads.
Size: 2 x layers x n_kv x d_head x max_len x bytes per element, times the batch.

Each layer has its own pair of buffers: one shared buffer for all layers made a compiled
decode step copy the whole cache at every layer (measured in the speed issue's probe).
"""

from __future__ import annotations

import torch

from llamablock.config import ModelConfig


class KVCache:
    def __init__(self, cfg: ModelConfig, batch_size: int, max_len: int | None = None,
                 dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu"):
        self.max_len = max_len or cfg.max_seq_len
        if batch_size <= 0 or self.max_len <= 0:
            raise ValueError(f"batch_size and max_len must be positive, got {batch_size}, {self.max_len}")
        shape = (batch_size, cfg.n_kv_heads, self.max_len, cfg.head_dim)  # (b, n_kv, s, d)
        self.keys = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(cfg.n_layers)]
        self.values = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(cfg.n_layers)]
        self.length = 0  # tokens already stored, the same for every layer

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Store k, v (b, n_kv, t, d) at [length, length + t); return all keys and values so far."""
        start, end = self.length, self.length + k.shape[2]
        if end > self.max_len:
            raise ValueError(f"KV cache is full: {end} tokens requested, room for {self.max_len}")
        self.keys[layer][:, :, start:end] = k
        self.values[layer][:, :, start:end] = v
        return self.keys[layer][:, :, :end], self.values[layer][:, :, :end]

    def advance(self, t: int) -> None:
        """Called by the model once all layers have stored t new tokens."""
        self.length += t

    def nbytes(self) -> int:
        """Bytes actually allocated by the buffers."""
        return sum(t.numel() * t.element_size() for t in self.keys + self.values)

    def reset(self) -> None:
        self.length = 0

"""KV-cache sizes for practitioners (module section 15.5).

    bytes = 2 (K and V) x layers x kv_heads x head_dim x tokens x bytes_per_element x batch

Two mistakes make published calculators wrong by 4-8x: using the query heads instead of the
key-value heads (GQA), and counting a sliding-window layer at the full context instead of at
its window (Mistral keeps only `sliding_window` tokens per layer; Gemma 2 and 3 mix windowed
and full layers, `ModelConfig.layer_kinds`). Both are handled here, and the counts are those that
`llamablock.kv_cache.KVCache` allocates (its ring holds the window).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from llamablock.config import ModelConfig
from llamablock.kv_cache import cache_bytes
from llamablock.util.units import DTYPE_BYTES


@dataclass(frozen=True)
class KVCacheSize:
    layout: str  # "MHA", "GQA" or "MQA"
    kv_heads: int
    tokens_kept: int  # per windowed layer: the sliding window if smaller than the context; else the context
    bytes_per_token: int  # all layers, one sequence, for a token inside the window
    bytes_per_layer: int  # one layer, whole batch, at `tokens_kept`
    total_bytes: int  # all layers, whole batch (full layers at the whole context)

    def to_dict(self) -> dict:
        return asdict(self)


def layout_name(n_heads: int, n_kv: int) -> str:
    return "MHA" if n_kv == n_heads else "MQA" if n_kv == 1 else "GQA"


def kv_cache_size(cfg: ModelConfig, tokens: int, batch: int = 1, dtype: str = "float16",
                  kv_heads: int | None = None) -> KVCacheSize:
    if dtype not in DTYPE_BYTES:
        raise ValueError(f"dtype must be one of {sorted(DTYPE_BYTES)}, got {dtype!r}")
    if tokens <= 0 or batch <= 0:
        raise ValueError(f"tokens and batch must be positive, got tokens={tokens}, batch={batch}")
    n_kv = cfg.n_kv_heads if kv_heads is None else kv_heads
    if n_kv <= 0 or cfg.n_heads % n_kv:
        raise ValueError(f"kv_heads must divide n_heads ({cfg.n_heads}), got {n_kv}")
    kept = min(tokens, cfg.sliding_window) if "sliding" in cfg.layer_kinds else tokens
    per_token_layer = 2 * n_kv * cfg.head_dim * DTYPE_BYTES[dtype]
    total = cache_bytes(cfg, tokens, batch, DTYPE_BYTES[dtype], n_kv)
    return KVCacheSize(layout_name(cfg.n_heads, n_kv), n_kv, kept, per_token_layer * cfg.n_layers,
                       per_token_layer * kept * batch, total)


def layouts(cfg: ModelConfig, tokens: int, batch: int = 1, dtype: str = "float16") -> list[KVCacheSize]:
    """The model as configured, beside MHA (kv = n_heads) and MQA (kv = 1) at the same size."""
    heads = sorted({cfg.n_heads, cfg.n_kv_heads, 1}, reverse=True)
    return [kv_cache_size(cfg, tokens, batch, dtype, kv_heads=h) for h in heads]

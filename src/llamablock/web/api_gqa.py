"""Figure of module section 15.5 (`gqa`): query heads joined to the KV heads they read, and the
KV cache size.

The size is what `KVCache(...).nbytes()` allocates for one sequence, built on torch's "meta"
device so that 4 GiB is counted, not allocated; `ModelConfig.kv_bytes_per_token` x tokens is
returned beside it (two routes through the library to the same number). Query head h reads KV
head h // group_size: attention.py stacks each group's query heads contiguously
(`q.reshape(b, n_kv, g * t, d)`), as transformers' `repeat_kv` does.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from fastapi import APIRouter, Query, Request

from llamablock.config import ModelConfig
from llamablock.kv_cache import KVCache
from llamablock.lab.details_text import render
from llamablock.presets import PRESETS, preset
from llamablock.util.reads import MAX_JSON, read_bytes_bounded
from llamablock.util.units import DTYPE_BYTES, human_bytes
from llamablock.web.errors import APIError

router = APIRouter()

MAX_TOKENS = 1 << 20  # 1,048,576: past the longest context of any preset
PARAMETERS = ("n_heads", "n_kv_heads", "n_layers", "head_dim")
DECODE_CLAIM = "15.5.decode-speed"  # the lab's record of decode attention time against KV heads


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _preset_fields(cfg: ModelConfig) -> dict:
    return {"n_heads": cfg.n_heads, "n_kv_heads": cfg.n_kv_heads, "n_layers": cfg.n_layers,
            "head_dim": cfg.head_dim, "max_seq_len": cfg.max_seq_len}


def _measured_decode(path: Path) -> dict | None:
    """The decode-attention timing by KV heads that `llamablock lab` measured (claim
    "15.5.decode-speed" of its results.json), when the lab has been run; None when it has not,
    and the page says so rather than guessing a time. The file is read bounded (a FIFO given as
    --lab-results would hold a request thread for ever)."""
    try:
        doc = json.loads(read_bytes_bounded(path, MAX_JSON, "lab results"))
        claim = next(c for c in doc["claims"] if c.get("id") == DECODE_CLAIM)
        details = render(claim.get("details") or [])  # said() entries, written as the report writes them
    except (OSError, ValueError, KeyError, TypeError, IndexError, StopIteration):
        return None
    return {"source": str(path), "date": (doc.get("environment") or {}).get("date"), "verdict": claim.get("verdict"),
            "ratio_32_to_8": claim.get("measured"), "details": details[:600]}


@router.get("/api/presets")
def presets() -> dict:
    return {"default": "llama-3-8b", "presets": {name: _preset_fields(preset(name)) for name in PRESETS}}


@router.get("/api/gqa")
def gqa(
    request: Request,
    preset_name: str = Query("llama-3-8b", alias="preset", max_length=40, description="a preset name"),
    n_heads: int | None = Query(None, ge=1, le=256, description="query heads (default: the preset's)"),
    n_kv_heads: int | None = Query(None, ge=1, le=256, description="key-value heads, a divisor of n_heads"),
    n_layers: int | None = Query(None, ge=1, le=256, description="layers"),
    head_dim: int | None = Query(None, ge=1, le=1024, description="head width"),
    tokens: int = Query(8192, ge=1, le=MAX_TOKENS, description="tokens in the cache"),
    dtype: str = Query("float16", max_length=16, description=f"one of {list(DTYPE_BYTES)}"),
) -> dict:
    if preset_name not in PRESETS:
        raise APIError("preset", f"unknown preset {preset_name!r}; known presets: {', '.join(sorted(PRESETS))}")
    if dtype not in DTYPE_BYTES:
        raise APIError("dtype", f"dtype must be one of {list(DTYPE_BYTES)}, got {dtype!r}")
    base = preset(preset_name)
    heads = n_heads or base.n_heads
    kv = n_kv_heads or (base.n_kv_heads if heads == base.n_heads else heads)
    if heads % kv:
        raise APIError("n_kv_heads", f"n_kv_heads must divide n_heads ({heads}); choose one of {_divisors(heads)}, got {kv}")
    try:
        cfg = base.replace(n_heads=heads, n_kv_heads=kv, n_layers=n_layers or base.n_layers,
                           head_dim=head_dim or base.head_dim)
    except ValueError as e:  # ModelConfig names the field; the odd-width message names "rotary width"
        field = str(e).split(" ")[0]
        raise APIError(field if field in PARAMETERS else "head_dim" if "rotary" in str(e) else None, str(e)) from None
    torch_dtype = getattr(torch, dtype)  # the names of DTYPE_BYTES are torch's
    # The figure is about heads: every layer at the whole context. A windowed model's cache keeps a
    # ring of `sliding_window` slots per windowed layer (KVCache); that size is shown beside it.
    whole = cfg.replace(sliding_window=None, layer_types=None, local_rope_theta=None)
    nbytes = KVCache(whole, batch_size=1, max_len=tokens, dtype=torch_dtype, device="meta").nbytes()
    mha = KVCache(whole.replace(n_kv_heads=cfg.n_heads), 1, tokens, torch_dtype, "meta").nbytes()
    element = DTYPE_BYTES[dtype]
    window_bytes = None
    if cfg.sliding_window and cfg.sliding_window < tokens:
        window_bytes = KVCache(cfg, 1, tokens, torch_dtype, "meta").nbytes()
    return {
        "preset": preset_name, "n_heads": cfg.n_heads, "n_kv_heads": cfg.n_kv_heads, "n_layers": cfg.n_layers,
        "head_dim": cfg.head_dim, "tokens": tokens, "dtype": dtype, "bytes_per_element": element,
        "group_size": cfg.group_size, "kv_divisors": _divisors(cfg.n_heads),
        "kv_head_of_query": [h // cfg.group_size for h in range(cfg.n_heads)],
        "cache_bytes": nbytes, "cache_text": human_bytes(nbytes),
        "bytes_per_token": cfg.kv_bytes_per_token(element),
        "cache_bytes_from_per_token": cfg.kv_bytes_per_token(element) * tokens,
        "mha_bytes": mha, "mha_text": human_bytes(mha), "fraction_of_mha": nbytes / mha,
        "sliding_window": cfg.sliding_window,
        "window_bytes": window_bytes, "window_text": human_bytes(window_bytes) if window_bytes else None,
        "measured_decode": _measured_decode(Path(request.app.state.lab_results)),
    }

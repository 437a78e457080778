"""Refusing a training run that cannot fit in this machine's memory, before anything is allocated.

`--batch-size 10**9` or `--set n_layers=200000` would otherwise reach torch's allocator and end in
a MemoryError, or the kernel killing the process. The estimate is deliberately rough and errs low
(so a run that fits is never refused): float32 weights, gradients and AdamW's two moments (16
bytes per parameter), plus the activations autograd keeps for one batch (a few d_model-wide
tensors per token and layer, and the logits). Only a run whose estimate exceeds
the physical memory is refused, naming the flag that makes it large.
"""

from __future__ import annotations

import os

GIB = 1024**3


def physical_memory() -> int | None:
    """Bytes of RAM (os.sysconf), or None where the system does not say."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def parameter_count(cfg) -> int:
    """The parameters of `cfg` by arithmetic (building the model is what must not happen)."""
    d, hd = cfg.d_model, cfg.head_dim
    attn = d * cfg.n_heads * hd * 2 + d * cfg.n_kv_heads * hd * 2
    ffn = d * cfg.d_ff * (3 if cfg.ffn in ("swiglu", "geglu") else 2)
    embed = cfg.vocab_size * d * (1 if cfg.tie_embeddings else 2)
    positions = cfg.max_seq_len * d if cfg.position == "learned" else 0
    return cfg.n_layers * (attn + ffn) + embed + positions


def check_fits(cfg, t, ram: int | None = None) -> None:
    """ValueError naming the flag when training `cfg` with recipe `t` clearly needs more than `ram`."""
    ram = physical_memory() if ram is None else ram
    if not ram:
        return
    weights = 16 * parameter_count(cfg)
    tokens = t.batch_size * t.context
    # No term for the attention scores: fused attention never holds them whole, and the estimate must err low.
    acts = 4 * tokens * (8 * cfg.d_model + 2 * cfg.d_ff) * cfg.n_layers + 12 * tokens * cfg.vocab_size
    batch_ids = 8 * tokens  # the batch of token ids itself
    if weights > ram:
        raise ValueError(f"the model (n_layers={cfg.n_layers}, d_model={cfg.d_model}, d_ff={cfg.d_ff}, "
                         f"vocab_size={cfg.vocab_size}) needs about {weights / GIB:,.1f} GiB for its weights, "
                         f"gradients and AdamW moments, more than this machine's {ram / GIB:,.1f} GiB; choose "
                         "a smaller --set n_layers, d_model or d_ff")
    if weights + acts + batch_ids > ram:
        raise ValueError(f"--batch-size {t.batch_size} with --context {t.context} needs about "
                         f"{(acts + batch_ids) / GIB:,.1f} GiB of activations per step, more than this machine's "
                         f"{ram / GIB:,.1f} GiB; lower --batch-size or --context")

"""llamablock: the 2017 Transformer block and the 2024 LLaMA block, exact and side by side.

The module's own files sit at the package root, one idea each, in the module's order: config,
presets and families (the descendants' records), rope (15.1), rope_scaling and alibi (15.2),
positions, norm (15.3), ffn (15.4), attention and kv_cache (15.5), blocks and model (15.6). Every other concern is a
folder that imports only from the layers beneath it (tests/test_layers.py checks it): util, io,
runtime, fast and training, diagnostics, studies, lab, web, commands.

Shapes, in every shape comment of the package:
    b  batch                   t  new tokens             s  keys (cached + new)
    L  static cache slots      D  model width            V  vocabulary
    h  query heads             n_kv  key-value heads     g  = h / n_kv, queries per KV head
    hd head width              r  rotary width (hd x partial_rotary_factor)
    d_ff  feed-forward width;  matmuls in fast/quant: x (m, k) @ W^T, W (n, k)

The public names below are imported on first use (PEP 562), so that `import llamablock.cli`
(and `llamablock --help`) does not import torch.
"""

from __future__ import annotations

import importlib

__all__ = ["ModelConfig", "Decoder", "KVCache", "PRESETS", "preset", "config_from_hf", "config_to_hf",
           "load_pretrained", "load_model_and_tokenizer", "save_pretrained"]
_LAZY = {"ModelConfig": "llamablock.config", "Decoder": "llamablock.model", "KVCache": "llamablock.kv_cache",
         "PRESETS": "llamablock.presets", "preset": "llamablock.presets",
         "config_from_hf": "llamablock.io.hf_config", "config_to_hf": "llamablock.io.hf_config"}


def __getattr__(name: str):
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'llamablock' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


def load_pretrained(path=None, dtype=None):
    """A model from a transformers directory (config.json + safetensors) or a GGUF file."""
    from llamablock.io.loading import load_pretrained as _load

    return _load(path, dtype=dtype)


def load_model_and_tokenizer(path=None, dtype=None):
    """(Decoder, Tokenizer) for a model name, GGUF file or checkpoint directory (None: the default model)."""
    from llamablock.io.loading import load_model_and_tokenizer as _load

    return _load(path, dtype=dtype)


def save_pretrained(model, path):
    """Write config.json and model.safetensors in transformers' format."""
    from llamablock.io.hf_checkpoint import save_pretrained as _save

    return _save(model, path)

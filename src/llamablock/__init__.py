"""llamablock: the 2017 Transformer block and the 2024 LLaMA block, exact and side by side.

The module's own files sit at the package root, one idea each, in the module's order: config,
presets (and hf_config), rope (15.1), rope_scaling and alibi (15.2), positions, norm (15.3),
ffn (15.4), attention and kv_cache (15.5), blocks and model (15.6). Every other concern is a
folder that imports only from the layers beneath it (tests/test_layers.py checks it): util, io,
runtime, fast and training, diagnostics, studies, lab, web, commands.

Shapes, in every shape comment of the package:
    b  batch                   t  new tokens             s  keys (cached + new)
    L  static cache slots      D  model width            V  vocabulary
    h  query heads             n_kv  key-value heads     g  = h / n_kv, queries per KV head
    hd head width              r  rotary width (hd x partial_rotary_factor)
    d_ff  feed-forward width;  matmuls in fast/quant: x (m, k) @ W^T, W (n, k)
"""

from llamablock.config import ModelConfig
from llamablock.kv_cache import KVCache
from llamablock.model import Decoder
from llamablock.presets import PRESETS, preset

__all__ = ["ModelConfig", "Decoder", "KVCache", "PRESETS", "preset", "load_pretrained", "save_pretrained"]


def load_pretrained(path=None, dtype=None):
    """A model from a transformers directory (config.json + safetensors) or a GGUF file."""
    from llamablock.io.loading import load_pretrained as _load

    return _load(path, dtype=dtype)


def save_pretrained(model, path):
    """Write config.json and model.safetensors in transformers' format."""
    from llamablock.io.hf_checkpoint import save_pretrained as _save

    return _save(model, path)

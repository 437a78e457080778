"""llamablock: the 2017 Transformer block and the 2024 LLaMA block, exact and side by side."""

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

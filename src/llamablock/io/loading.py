"""Loading a model's weights as a float Decoder, from a source read once (io/source.py).

`load_decoder(source, dtype)` is what every command's build step calls (fast/plan.py); the
packed formats start from it or from fast/kernels/native.py, which reads a GGUF straight into packed
layers. `load_pretrained` and `load_model_and_tokenizer` are the library's one-call forms for a
name or path (the public API: llamablock.load_pretrained).
"""

from __future__ import annotations

from pathlib import Path

import torch

from llamablock.io.source import ModelSource, open_source
from llamablock.model import Decoder


def load_decoder(source: ModelSource, dtype: torch.dtype = torch.float32) -> Decoder:
    """The source's weights, every one a plain tensor of `dtype`: the float model."""
    if source.kind == "llamablock":
        from llamablock.io.llamablock_dir import load_llamablock_weights

        return load_llamablock_weights(source.path, source.cfg, source.where, dtype)
    if source.kind == "transformers":
        from llamablock.io.hf_checkpoint import load_hf_dir

        return load_hf_dir(source.path, dtype, source.cfg)
    from llamablock.io.gguf import gguf_decoder

    return gguf_decoder(source.index, source.cfg, dtype)


def load_pretrained(path: str | Path | None = None, dtype: torch.dtype | None = None) -> Decoder:
    """A transformers directory, a GGUF file, a llamablock folder or an embedded model's name (None:
    the default), as a float Decoder in `dtype` (default float32)."""
    return load_decoder(open_source(path, tokenizer=False), dtype or torch.float32)


def load_tokenizer(path: str | Path | None = None):
    """The tokenizer of a model name, GGUF file or checkpoint folder (None: the default model)."""
    return open_source(path).tokenizer


def load_model_and_tokenizer(path: str | Path | None = None, dtype: torch.dtype | None = None):
    """(Decoder, Tokenizer) for a model name or path, the file read once."""
    source = open_source(path)
    return load_decoder(source, dtype or torch.float32), source.tokenizer

"""`load_pretrained`: one entry point for every checkpoint format."""

from __future__ import annotations

from pathlib import Path

import torch

from llamablock.model import Decoder


def load_pretrained(path: str | Path | None = None, dtype: torch.dtype | None = None) -> Decoder:
    """A transformers directory, or a GGUF file (the real-models issue adds GGUF)."""
    if path is None:
        raise ValueError("give a checkpoint path: a transformers directory with config.json")
    p = Path(path)
    if p.is_dir():
        from llamablock.io.hf_checkpoint import load_hf_dir

        return load_hf_dir(p, dtype=dtype or torch.float32)
    if p.suffix == ".gguf":
        raise ValueError(f"{p}: GGUF loading is not available yet")
    raise FileNotFoundError(f"{p} is neither a checkpoint directory nor a .gguf file")

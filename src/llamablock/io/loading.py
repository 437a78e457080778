"""`load_pretrained`: one entry point for every checkpoint format.

A model is named as `llamablock.io.resolve` reads it: a transformers directory, a .gguf file, a
llamablock directory (a training run's checkpoint, or an export of one: llamablock.io.export), or
the name of a model shipped in a Python package (None: the default model).
"""

from __future__ import annotations

import math
from pathlib import Path

import torch

from llamablock.io.llamablock_dir import is_llamablock_dir, load_llamablock_dir
from llamablock.io.resolve import resolve_model
from llamablock.model import Decoder


def load_pretrained(path: str | Path | None = None, dtype: torch.dtype | None = None) -> Decoder:
    """A transformers directory, a GGUF file, or an embedded model's name (None: the default)."""
    p = resolve_model(path)
    if is_llamablock_dir(p):  # a run directory's checkpoint, or a llamablock export
        return load_llamablock_dir(p, dtype or torch.float32)[0]
    if p.is_dir():
        from llamablock.io.hf_checkpoint import load_hf_dir

        return load_hf_dir(p, dtype=dtype or torch.float32)
    if p.suffix == ".gguf" or p.is_file():
        from llamablock.io.gguf import load_gguf

        return load_gguf(p, dtype=dtype or torch.float32)
    raise FileNotFoundError(f"{p} is neither a checkpoint directory nor a .gguf file")


def load_model_and_tokenizer(path: str | Path | None = None, dtype: torch.dtype | None = None, reader=None):
    """(Decoder, Tokenizer) for a model name, GGUF file or transformers directory; a GGUF is read once
    (`reader`: the GGUF's, when the caller has it open already)."""
    from llamablock.io.tokenizer import tokenizer_from_dir, tokenizer_from_gguf

    p = resolve_model(path)
    if is_llamablock_dir(p):
        return load_llamablock_dir(p, dtype or torch.float32)
    if p.is_dir():
        return load_pretrained(p, dtype), tokenizer_from_dir(p)
    from llamablock.io.gguf import load_gguf, open_gguf

    reader = reader or open_gguf(p)
    return load_gguf(reader, dtype=dtype or torch.float32), tokenizer_from_gguf(reader)


def generation_defaults(path: str | Path | None = None) -> dict:
    """A transformers directory's generation_config.json (sampling defaults, transformers' keys),
    or {} when the checkpoint has none (a GGUF file keeps no sampling settings). The keys sampling
    reads are checked here, so that a bad one is refused naming the file and the key."""
    from llamablock.io.resolve import read_json

    p = resolve_model(path)
    f = p / "generation_config.json" if p.is_dir() else None
    if f is None or not f.is_file():
        return {}
    d = read_json(f)
    if d.get("do_sample") is not None and not isinstance(d["do_sample"], bool):
        raise ValueError(f"{f}: do_sample must be true or false, got {d['do_sample']!r}")
    used = ("repetition_penalty",) + (("temperature", "top_k", "top_p") if d.get("do_sample") else ())
    for key in used:
        v = d.get(key)
        if v is None:
            continue
        number = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
        ok = {"temperature": number and v >= 0, "top_p": number and 0 < v <= 1, "repetition_penalty": number and v > 0,
              "top_k": isinstance(v, int) and not isinstance(v, bool) and v >= 0}[key]
        if not ok:
            want = {"temperature": "a finite number >= 0", "top_p": "a number in (0, 1]",
                    "repetition_penalty": "a finite number > 0", "top_k": "a whole number >= 0"}[key]
            raise ValueError(f"{f}: {key} must be {want}, got {v!r}")
    return d

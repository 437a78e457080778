"""Run a checkpoint in its own precision (`--dtype auto`), loading a GGUF straight into packed layers.

The format of each weight follows the file:
    GGUF F32                       float32 (a file of only F32 tensors runs in float32)
    GGUF F16, BF16                 bfloat16
    GGUF Q8_0, Q5_*, Q6_K          q8: int8 rows (fast/quant.py). 5- and 6-bit blocks go to 8 bits
                                   rather than 4, so the file's precision is kept at some memory cost
    GGUF Q4_0, Q4_1, Q4_K          q4: int4 groups of 32
    transformers directory         its config.json's torch_dtype (float16 runs as bfloat16)
With any quantized weight the activations, norms and embeddings are bfloat16, the packed
kernels' activation dtype; the output head is q8 as in `quantize_model`. A tied embedding stored
quantized is that q8 head's int8 rows (Int8Embedding): one copy for both.

A quantized GGUF is read tensor by tensor (io/gguf.py `gguf_tensors`): each weight is dequantized,
rounded to bfloat16 and quantized into its packed layer before the next is read, so the whole
model never exists in float. Rounding to bfloat16 first is what the dequantize-then-quantize path
(`load_dtype` + `apply_dtype`) does, so both give the same logits (tests/fast/test_native.py; the
shared embedding differs from a bfloat16 one within the q8 step, as stated there).

Memory (`llamablock bench memory` measures the peak against the file's size): the
reader's parse of the header is dropped once the tokenizer is built, keeping only an index of
the tensors (io/gguf_read.py TensorIndex), the file is read by read(2), never through a mapping
(io/gguf_read.py), large temporaries get their own mappings while loading (fast/malloc.py), and
an int4 layer holds its ids once (fast/int4pack.py).
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import torch
from torch import nn

from llamablock.fast.malloc import mapped_large_blocks, release_free_memory
from llamablock.fast.quant import (
    DTYPE_CHOICES,
    Int4Linear,
    Int8Embedding,
    Int8Linear,
    apply_dtype,
    load_dtype,
)
from llamablock.io.empty import empty_decoder
from llamablock.io.gguf import (
    config_from_gguf,
    gguf_tensors,
    open_gguf,
    tensor_index,
)
from llamablock.io.resolve import resolve_model

CHOICES = ("auto", *DTYPE_CHOICES)
GGUF_FORMATS = {"F32": "float32", "F16": "bfloat16", "BF16": "bfloat16", "Q8_0": "q8", "Q5_0": "q8", "Q5_1": "q8",
                "Q5_K": "q8", "Q6_K": "q8", "Q4_0": "q4", "Q4_1": "q4", "Q4_K": "q4"}
TRIM_EVERY = 16  # packed tensors between two malloc_trim calls (each walks the whole heap)
HF_DTYPES = {"float32": "float32", "bfloat16": "bfloat16", "float16": "bfloat16"}


def _linear_names(model) -> set[str]:
    return {f"{name}.weight" for name, m in model.named_modules() if isinstance(m, nn.Linear)}


def _packed(w: torch.Tensor, fmt: str, group_size: int = 32) -> nn.Module:
    """w: bfloat16, as load_dtype("q8"/"q4") would have stored it."""
    if fmt == "q4" and w.shape[1] % group_size == 0:
        return Int4Linear(w, None, group_size)
    return Int8Linear(w, None)


def _set_module(model: nn.Module, dotted: str, module: nn.Module) -> None:
    parent, _, child = dotted.rpartition(".")
    setattr(model.get_submodule(parent) if parent else model, child, module)


def _shared_head(name: str, rows) -> Int8Linear:
    """The q8 head from a tied embedding's rows (a RowChunks: never whole in bfloat16). A row with a
    NaN or infinity has a non-finite scale: refused by name, as Decoder.assign_weights does."""
    head = Int8Linear(rows, None)
    if not torch.isfinite(head.scales).all():
        raise ValueError(f"the checkpoint's {name} holds non-finite values (NaN or infinity); it is damaged")
    return head


def _read_weights(reader, cfg, model, dtype: torch.dtype):
    """Pack the file's weights into `model` as they are read; return (plain tensors by name, {format:
    tensors}, the shared q8 head or None). Large blocks get their own mappings meanwhile, so the
    temporaries of each tensor go back to the system instead of fragmenting the heap (fast/malloc.py)."""
    expected = {name: p.shape for name, p in model.state_dict(keep_vars=True).items()}
    linears = _linear_names(model)
    embed = next((t.tensor_type.name for t in reader.tensors if t.name == "token_embd.weight"), None)
    shared = frozenset({"embed.weight"} if cfg.tie_embeddings and GGUF_FORMATS.get(embed) in ("q8", "q4") else ())
    plain, used, head = {}, Counter(), None
    with mapped_large_blocks():
        for name, kind, w in gguf_tensors(reader, cfg, expected, dtype, chunked=shared):
            fmt = GGUF_FORMATS[kind] if name in linears else "plain"
            if name == "head.weight" and fmt == "q4":
                fmt = "q8"  # the output head stays 8-bit, as in quantize_model
            if name in shared:
                head, fmt = _shared_head(name, w), "q8"  # the embedding reads it too (Int8Embedding)
            elif fmt in ("q8", "q4"):
                _set_module(model, name.rsplit(".", 1)[0], _packed(w, fmt))
                if sum(used.values()) % TRIM_EVERY == 0:
                    release_free_memory()  # the small temporaries' holes, before they add up
            else:  # norms, biases, float embeddings and float weights
                plain[name] = w
            used[fmt if fmt != "plain" else str(dtype).removeprefix("torch.")] += 1
            del w  # before the next tensor is read: one weight in float at a time
    return plain, used, head


def load_gguf_native(path_or_reader, rope_layout: str = "half", cfg=None):
    """(Decoder, {format: tensors}) for a GGUF, each weight in the format its type maps to; `cfg`:
    the file's config when already read (load_model reads it before dropping the vocabulary).

    A tied embedding stored quantized becomes the q8 head, and the embedding table reads its
    rows (Int8Embedding): one int8 copy instead of a bfloat16 table beside an int8 head. Its
    rows are the head's, within the q8 step of the file's (`llamablock bench memory`)."""
    reader = path_or_reader
    if not hasattr(reader, "tensors"):  # a path: the reader's parse goes before the weights come
        reader = open_gguf(path_or_reader)
        cfg, reader = cfg or config_from_gguf(reader), tensor_index(reader)
        release_free_memory()
    cfg = (cfg or config_from_gguf(reader)).replace(rope_layout=rope_layout)
    model = empty_decoder(cfg)
    types = {t.tensor_type.name for t in reader.tensors if t.name.endswith(".weight") and len(t.shape) > 1}
    dtype = torch.float32 if types <= {"F32"} else torch.bfloat16
    plain, used, head = _read_weights(reader, cfg, model, dtype)
    biases = {n: b for n, b in plain.items() if n.endswith(".bias")}
    model.assign_weights({n: t for n, t in plain.items() if n not in biases})
    for name, b in biases.items():  # a packed layer keeps its bias in bfloat16
        module = model.get_submodule(name.rsplit(".", 1)[0])
        module.bias = b.to(torch.bfloat16) if isinstance(module, (Int8Linear, Int4Linear)) else nn.Parameter(b)
    if head is not None:
        model.head, model.embed = head, Int8Embedding(head)
    elif dtype == torch.bfloat16 and cfg.tie_embeddings:  # the tied head, q8 as quantize_model makes it
        model.head = Int8Linear(model.embed.weight, None)
        used["q8"] += 1
    return model.eval(), dict(used)


def hf_dtype(directory: Path) -> str:
    """A transformers directory's own precision (config.json's torch_dtype; v5 calls it dtype)."""
    try:
        d = json.loads((directory / "config.json").read_text())
    except (OSError, ValueError):
        return "float32"
    label = d.get("torch_dtype") or d.get("dtype") or "float32" if isinstance(d, dict) else "float32"
    if label not in HF_DTYPES:
        raise ValueError(f"{directory}/config.json torch_dtype must be one of {sorted(HF_DTYPES)}, got {label!r}")
    return HF_DTYPES[label]


def load_model(path, choice: str = "auto", device: str = "cpu"):
    """(model, tokenizer, what) for a model name or path in `choice` of CHOICES, on `device`; `what`
    says in one line which formats the weights run in, for the command line to print. The packed
    formats run on the CPU only: elsewhere `auto` runs bfloat16, and q8/q4 are refused."""
    from llamablock.io.loading import load_model_and_tokenizer
    from llamablock.io.tokenizer import tokenizer_from_gguf

    if choice not in CHOICES:
        raise ValueError(f"--dtype must be one of {', '.join(CHOICES)}, got {choice!r}")
    if device != "cpu":
        if choice in ("q8", "q4"):
            raise ValueError(f"--dtype {choice} runs on the CPU only (PyTorch's packed int8/int4 kernels); "
                             f"use --device cpu, or bfloat16 on {device}")
        if choice == "auto":
            choice = "float32" if hf_dtype_of(path) == "float32" else "bfloat16"
        model, tok = load_model_and_tokenizer(path, load_dtype(choice))
        return model.to(device), tok, f"{choice} on {device}"
    p = resolve_model(path)
    if choice == "auto" and not p.is_dir():
        reader = open_gguf(p)
        tok, cfg = tokenizer_from_gguf(reader), config_from_gguf(reader)
        index = tensor_index(reader)
        del reader  # the header's parse goes before the weights take its place
        release_free_memory()
        model, used = load_gguf_native(index, cfg=cfg)
        del index  # and its file mapping
        release_free_memory()
        what = ", ".join(f"{n} tensors {fmt}" for fmt, n in sorted(used.items()))
        return model, tok, f"the file's own precision: {what}"
    if choice == "auto":
        choice = hf_dtype(p)
    model, tok = load_model_and_tokenizer(p, load_dtype(choice))
    return apply_dtype(model, choice), tok, choice


def hf_dtype_of(path) -> str:
    """float32 for an all-F32 GGUF or a float32 directory, else bfloat16: the float format off the CPU."""
    p = resolve_model(path)
    if p.is_dir():
        return hf_dtype(p)
    types = {t.tensor_type.name for t in open_gguf(p).tensors if len(t.shape) > 1}
    return "float32" if types <= {"F32"} else "bfloat16"


def engine_format(path, choice: str = "auto", reader=None) -> str:
    """The one format a compiled engine runs `path` in (it quantizes its fused weights itself): for
    `auto`, the format most of a GGUF's linear weights map to, or a directory's own dtype. `reader`:
    the GGUF already open, whose parse the caller then loads from too, rather than parsing the
    header (the whole vocabulary) a second time."""
    if choice != "auto":
        return choice
    p = resolve_model(path)
    if p.is_dir():
        return hf_dtype(p)
    reader = reader or open_gguf(p)
    linear = Counter(GGUF_FORMATS.get(t.tensor_type.name, "float32") for t in reader.tensors
                     if t.name.startswith("blk.") and t.name.endswith(".weight") and len(t.shape) > 1)
    return linear.most_common(1)[0][0] if linear else "float32"

"""Run a checkpoint in its own precision (`--dtype auto`), loading a GGUF straight into packed layers.

The format of each weight follows the file (fast/formats.py GGUF_TYPES: F32 float32, F16 and
BF16 bfloat16, Q8_0 / Q5_* / Q6_K q8, Q4_* q4, Q4_K with its own ids (fast/kernels/kquant.py); a file
of only F32 tensors runs in float32); a transformers directory runs in its config.json's torch_dtype (TORCH_DTYPES). With any quantized
weight the activations, norms and embeddings are bfloat16, the packed kernels' activation dtype; the output head is q8 as in `quantize_model`. A tied embedding stored
quantized is that q8 head's int8 rows (Int8Embedding): one copy for both.

A quantized GGUF is read tensor by tensor (io/gguf.py `gguf_tensors`): each weight is dequantized,
rounded to bfloat16 and quantized into its packed layer before the next is read, so the whole
model never exists in float. Rounding to bfloat16 first is what the dequantize-then-quantize path
(`load_dtype` + `apply_dtype`) does, so both give the same logits (tests/fast/kernels/test_native.py; the
shared embedding differs from a bfloat16 one within the q8 step, as stated there). Two kinds are
read undecoded instead: the blocks the kernel keeps (Q4_0, Q4_1, Q8_0: fast/kernels/file_blocks.py), and
Q4_K, whose ids go into the int4 layer as they are (fast/kernels/kquant.py).

Memory (`llamablock bench memory` measures the peak against the file's size): the
reader's parse of the header is dropped once the tokenizer is built, keeping only an index of
the tensors (io/gguf_read.py TensorIndex), the file is read by read(2), never through a mapping
(io/gguf_read.py), large temporaries get their own mappings while loading (fast/kernels/malloc.py), and
an int4 layer holds its ids once (fast/kernels/int4pack.py).
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import torch
from torch import nn

from llamablock.fast.formats import GGUF_TYPES, TORCH_DTYPES
from llamablock.fast.kernels import ggml_kernel
from llamablock.fast.kernels.file_blocks import BlockEmbedding, BlockLinear
from llamablock.fast.kernels.kquant import q4k_linear
from llamablock.fast.kernels.malloc import mapped_large_blocks, release_free_memory
from llamablock.fast.kernels.quant import Int4Linear, Int8Embedding, Int8Linear
from llamablock.io.empty import empty_decoder
from llamablock.io.gguf import config_from_gguf, gguf_tensors, open_gguf, tensor_index
from llamablock.io.source import ModelSource

TRIM_EVERY = 16  # packed tensors between two malloc_trim calls (each walks the whole heap)


def kept_types() -> frozenset[str]:
    """The GGUF types whose blocks run as stored here (BlockLinear): Q4_0, Q4_1 and Q8_0 where the
    block kernel builds (fast/kernels/ggml_kernel.py), else none, and those types are re-quantized."""
    return frozenset(ggml_kernel.BLOCK_BYTES) if ggml_kernel.kernel() is not None else frozenset()


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


def _read_weights(reader, cfg, model, dtype: torch.dtype, kept: frozenset[str]):
    """Pack the file's weights into `model` as they are read; return (plain tensors by name, {format:
    tensors}, the shared head or None). A linear weight (or a tied embedding) of a type in `kept`
    becomes a BlockLinear of the file's bytes. Large blocks get their own mappings meanwhile, so
    the temporaries of each tensor go back to the system instead of fragmenting the heap
    (fast/kernels/malloc.py)."""
    expected = {name: p.shape for name, p in model.state_dict(keep_vars=True).items()}
    linears = _linear_names(model)
    embed = next((t.tensor_type.name for t in reader.tensors if t.name == "token_embd.weight"), None)
    tied = cfg.tie_embeddings and (GGUF_TYPES.get(embed) in ("q8", "q4") or embed in kept)
    shared = frozenset({"embed.weight"} if tied else ())
    def as_blocks(name: str, kind: str) -> bool:  # read undecoded: kept blocks, and Q4_K's ids (fast/kernels/kquant.py)
        return (kind in kept and (name in linears or name in shared)
                or kind == "Q4_K" and name in linears and name != "head.weight")

    plain, used, head = {}, Counter(), None
    with mapped_large_blocks():
        for name, kind, w in gguf_tensors(reader, cfg, expected, dtype, chunked=shared, as_blocks=as_blocks):
            fmt = GGUF_TYPES[kind] if name in linears else "plain"
            if kind == "Q4_K" and as_blocks(name, kind):
                _set_module(model, name.rsplit(".", 1)[0], q4k_linear(w.rows, w.shape[1]))
                fmt = "Q4_K ids in q4"
            elif as_blocks(name, kind):
                layer = BlockLinear(kind, w.rows, w.shape[1])
                if name in shared:
                    head = layer  # the embedding reads its rows too (BlockEmbedding)
                else:
                    _set_module(model, name.rsplit(".", 1)[0], layer)
                fmt = f"{kind} blocks"
            elif name in shared:
                head, fmt = _shared_head(name, w), "q8"  # the embedding reads it too (Int8Embedding)
            elif fmt in ("q8", "q4"):
                fmt = "q8" if name == "head.weight" else fmt  # the output head stays 8-bit, as in quantize_model
                _set_module(model, name.rsplit(".", 1)[0], _packed(w, fmt))
                if sum(used.values()) % TRIM_EVERY == 0:
                    release_free_memory()  # the small temporaries' holes, before they add up
            else:  # norms, biases, float embeddings and float weights
                plain[name] = w
            used[fmt if fmt != "plain" else str(dtype).removeprefix("torch.")] += 1
            del w  # before the next tensor is read: one weight in float at a time
    return plain, used, head


def native_decoder(index, cfg) -> tuple[nn.Module, dict]:
    """(Decoder, {format: tensors}) for a GGUF's tensors (`index`: io/gguf_read.py TensorIndex, the
    header's parse already dropped), each weight in the format its type maps to.

    A tied embedding stored quantized becomes the q8 head, and the embedding table reads its
    rows (Int8Embedding): one int8 copy instead of a bfloat16 table beside an int8 head. Its
    rows are the head's, within the q8 step of the file's (`llamablock bench memory`)."""
    release_free_memory()  # the parse's freed objects back to the system before the weights come
    model = empty_decoder(cfg)
    types = {t.tensor_type.name for t in index.tensors if t.name.endswith(".weight") and len(t.shape) > 1}
    kept = kept_types()
    # bfloat16 activations where a weight runs in a packed layer (their kernels take bfloat16) or the
    # file is 16-bit; float32 for an all-F32 file, and where the quantized weights are all kept blocks
    packed = types - kept - {"F32", "F16", "BF16"}
    dtype = torch.float32 if types <= {"F32"} or (types & kept and not packed) else torch.bfloat16
    plain, used, head = _read_weights(index, cfg, model, dtype, kept)
    biases = {n: b for n, b in plain.items() if n.endswith(".bias")}
    model.assign_weights({n: t for n, t in plain.items() if n not in biases})
    for name, b in biases.items():  # a packed layer keeps its bias in bfloat16, a block layer in float32
        module = model.get_submodule(name.rsplit(".", 1)[0])
        if isinstance(module, (Int8Linear, Int4Linear, BlockLinear)):
            module.bias = b.to(torch.bfloat16 if not isinstance(module, BlockLinear) else torch.float32)
        else:
            module.bias = nn.Parameter(b)
    if isinstance(head, BlockLinear):
        model.head, model.embed = head, BlockEmbedding(head, dtype)
    elif head is not None:
        model.head, model.embed = head, Int8Embedding(head)
    elif dtype == torch.bfloat16 and cfg.tie_embeddings:  # the tied head, q8 as quantize_model makes it
        model.head = Int8Linear(model.embed.weight, None)
        used["q8"] += 1
    release_free_memory()
    return model.eval(), dict(used)


def load_gguf_native(path: str | Path, rope_layout: str = "half") -> tuple[nn.Module, dict]:
    """native_decoder for a GGUF file by path (the library's one-call form)."""
    reader = open_gguf(path)
    cfg = config_from_gguf(reader).replace(rope_layout=rope_layout)
    index = tensor_index(reader)
    del reader  # the reader's parse goes before the weights come
    return native_decoder(index, cfg)


def dir_format(label: str, where: str) -> str:
    """The format of a directory's torch_dtype label (float16 runs as bfloat16)."""
    if label not in TORCH_DTYPES:
        raise ValueError(f"{where} torch_dtype must be one of {sorted(TORCH_DTYPES)}, got {label!r}")
    return TORCH_DTYPES[label]


def float_format(source: ModelSource) -> str:
    """float32 for an all-F32 GGUF or a float32 directory, else bfloat16: `auto` off the CPU."""
    if source.kind != "gguf":
        return dir_format(source.stored["*"], source.where)
    return "float32" if set(source.stored.values()) <= {"F32"} else "bfloat16"


def own_format(source: ModelSource) -> str:
    """The one format a compiled engine runs `source` in under `auto`: "blocks" for a GGUF whose layer
    matrices are all kept blocks (kept_types), else the format most of them map to (the engine
    quantizes its fused weights itself), or a directory's dtype."""
    if source.kind != "gguf":
        return dir_format(source.stored["*"], source.where)
    stored = {kind for name, kind in source.stored.items() if name.startswith("blk.") and name.endswith(".weight")}
    if stored and stored <= kept_types():
        return "blocks"  # the file's own blocks, which the compiled engine fuses as they are
    layers = Counter(GGUF_TYPES.get(kind, "float32") for name, kind in source.stored.items()
                     if name.startswith("blk.") and name.endswith(".weight"))
    return layers.most_common(1)[0][0] if layers else "float32"

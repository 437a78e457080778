"""Load a GGUF straight into the layers its plan names: each stored type's format, the head's and
the activation dtype come from fast/plan.py (`decide`: the file's own precision under `--dtype
auto`), never decided here. A tied embedding stored quantized is the head's rows (Int8Embedding,
BlockEmbedding): one copy for both; an untied one in a type the kernel keeps reads its own blocks
(never a float table: tests/fast/kernels/test_file_size.py).

A quantized GGUF is read tensor by tensor (io/gguf.py `gguf_tensors`): each weight is dequantized,
rounded to bfloat16 and quantized into its packed layer before the next is read, so the whole
model never exists in float. Rounding to bfloat16 first is what the dequantize-then-quantize path
(`load_dtype` + `apply_dtype`) does, so both give the same logits (tests/fast/kernels/test_native.py; the
shared embedding differs from a bfloat16 one within the q8 step, as stated there). Two kinds are
read undecoded instead: the blocks the kernel keeps (ggml_kernel.KEPT: fast/kernels/file_blocks.py), and,
where the plan puts Q4_K in q4 (no kernel), Q4_K, whose ids go into the int4 layer as they are
(fast/kernels/kquant.py).

Memory (`llamablock bench memory` measures the peak against the file's size): the
reader's parse of the header is dropped once the tokenizer is built, keeping only an index of
the tensors (io/gguf_read.py TensorIndex), the file is read by read(2), never through a mapping
(io/gguf_read.py), large temporaries get their own mappings while loading (fast/kernels/malloc.py), and
an int4 layer holds its ids once (fast/kernels/int4pack.py).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import torch
from torch import nn

from llamablock.fast.formats import GGUF_TYPES
from llamablock.fast.kernels import ggml_kernel
from llamablock.fast.kernels.file_blocks import BlockEmbedding, BlockLinear, group_rows
from llamablock.fast.kernels.ggml_kernel import GROUP, GROUPABLE
from llamablock.fast.kernels.kquant import q4k_linear
from llamablock.fast.kernels.malloc import mapped_large_blocks, release_free_memory
from llamablock.fast.kernels.quant import PREFILL_ROWS, Int4Linear, Int8Embedding, Int8Linear
from llamablock.io.empty import empty_decoder
from llamablock.io.gguf import gguf_tensors

TRIM_EVERY = 16  # packed tensors between two malloc_trim calls (each walks the whole heap)


def _linear_names(model) -> set[str]:
    return {f"{name}.weight" for name, m in model.named_modules() if isinstance(m, nn.Linear)}


def _packed(w: torch.Tensor, fmt: str, prefill: dict, group_size: int = 32) -> nn.Module:
    """w: bfloat16, as load_dtype("q8"/"q4") would have stored it."""
    if fmt == "q4" and w.shape[1] % group_size == 0:
        return Int4Linear(w, None, group_size, prefill.get("q4", PREFILL_ROWS))
    return Int8Linear(w, None, prefill.get("q8", PREFILL_ROWS))


def _set_module(model: nn.Module, dotted: str, module: nn.Module) -> None:
    parent, _, child = dotted.rpartition(".")
    setattr(model.get_submodule(parent) if parent else model, child, module)


def _shared_head(name: str, rows, crossover) -> Int8Linear:
    """The q8 head from a tied embedding's rows (a RowChunks: never whole in bfloat16). A row with a
    NaN or infinity has a non-finite scale: refused by name, as Decoder.assign_weights does."""
    head = Int8Linear(rows, None, crossover)
    if not torch.isfinite(head.scales).all():
        raise ValueError(f"the checkpoint's {name} holds non-finite values (NaN or infinity); it is damaged")
    return head


@dataclass(frozen=True)
class WeightPlan:
    """What the plan (fast/plan.py) hands the loader: each stored type's format for the layer
    matrices (fast/formats.py FORMATS), the output head's, and for the blocks the binding that
    calls the kernel, whether rows are held in groups of 8, and the packed layers' prefill
    crossovers ({format: rows or None})."""

    formats: dict
    head: str
    binding: object = None
    grouped: bool = False
    prefill: dict = field(default_factory=dict)

    def of(self, name: str, kind: str, shared: frozenset) -> str:
        """The format of our tensor `name` stored as GGUF type `kind`."""
        return self.head if name == "head.weight" or name in shared else self.formats.get(kind, "plain")


def _read_weights(reader, cfg, model, dtype: torch.dtype, weights: WeightPlan):
    """Pack the file's weights into `model` as they are read; return (plain tensors by name, {format:
    tensors}, the shared head or None). A linear weight (or a tied embedding) in format blocks
    becomes a BlockLinear of the file's bytes; a Q4_K one in q4 keeps its ids (fast/kernels/kquant.py).
    Large blocks get their own mappings meanwhile, so the temporaries of each tensor go back to
    the system instead of fragmenting the heap (fast/kernels/malloc.py)."""
    expected = {name: p.shape for name, p in model.state_dict(keep_vars=True).items()}
    linears = _linear_names(model)
    embed = next((t.tensor_type.name for t in reader.tensors if t.name == "token_embd.weight"), None)
    tied = cfg.tie_embeddings and GGUF_TYPES.get(embed) in ("q8", "q4") and weights.head in ("q8", "blocks")
    shared = frozenset({"embed.weight"} if tied else ())
    # An untied embedding in a type the kernel keeps is read through its blocks too (BlockEmbedding):
    # as a float table it would be the largest tensor of a 1B model's memory (`bench memory`).
    own_rows = not tied and embed in ggml_kernel.KEPT and weights.formats.get(embed) == "blocks"

    def as_blocks(name: str, kind: str) -> bool:  # read undecoded: the file's blocks, and Q4_K's ids
        if name == "embed.weight" and own_rows:
            return True
        if name not in linears and name not in shared:
            return False
        fmt = weights.of(name, kind, shared)
        return fmt == "blocks" or (fmt == "q4" and kind == "Q4_K")

    plain, used, head = {}, Counter(), None
    with mapped_large_blocks():
        for name, kind, w in gguf_tensors(reader, cfg, expected, dtype, chunked=shared, as_blocks=as_blocks):
            fmt = weights.of(name, kind, shared) if name in linears or name in shared else "plain"
            if name == "embed.weight" and own_rows:  # the embedding's own rows, in the file's order
                rows = BlockLinear(kind, w.rows, w.shape[1], binding=weights.binding)
                model.embed, fmt = BlockEmbedding(rows, dtype, owned=True), f"{kind} blocks"
            elif as_blocks(name, kind) and fmt == "q4":
                _set_module(model, name.rsplit(".", 1)[0], q4k_linear(w.rows, w.shape[1],
                                                                      weights.prefill.get("q4", PREFILL_ROWS)))
                fmt = "Q4_K ids in q4"
            elif as_blocks(name, kind):
                # groups of 8 rows where the plan says so and the type has that layout, else the file's order
                grouped = weights.grouped and kind in GROUPABLE and w.rows.shape[0] % GROUP == 0
                rows = group_rows(kind, w.rows, in_place=True) if grouped else w.rows  # read_blocks' own copy
                layer = BlockLinear(kind, rows, w.shape[1], grouped=grouped, binding=weights.binding)
                if name in shared:
                    head = layer  # the embedding reads its rows too (BlockEmbedding)
                else:
                    _set_module(model, name.rsplit(".", 1)[0], layer)
                fmt = f"{kind} blocks"
            elif name in shared:  # the embedding reads it too (Int8Embedding)
                head, fmt = _shared_head(name, w, weights.prefill.get("q8", PREFILL_ROWS)), "q8"
            elif fmt in ("q8", "q4"):
                _set_module(model, name.rsplit(".", 1)[0], _packed(w, fmt, weights.prefill))
                if sum(used.values()) % TRIM_EVERY == 0:
                    release_free_memory()  # the small temporaries' holes, before they add up
            else:  # norms, biases, float embeddings and float weights
                plain[name] = w
                fmt = "plain"
            used[fmt if fmt != "plain" else str(dtype).removeprefix("torch.")] += 1
            del w  # before the next tensor is read: one weight in float at a time
    return plain, used, head


def native_decoder(index, cfg, formats: dict, activations: torch.dtype, *, head: str = "q8", binding=None,
                   grouped: bool = False, prefill: dict | None = None) -> tuple[nn.Module, dict]:
    """(Decoder, {format: tensors}) for a GGUF's tensors (`index`: io/gguf_read.py TensorIndex, the
    header's parse already dropped), each layer matrix in the format `formats` gives its stored
    type, the output head in `head`, and every other tensor in the `activations` dtype; the plan
    (fast/plan.py) decides all of them. `binding` is the function a BlockLinear calls
    (ggml_kernel.matmul, or block_op.linear inside compiled programs), `grouped` whether blocks
    are held in groups of 8 rows, `prefill` the packed layers' crossovers.

    A tied embedding stored quantized becomes the head (q8, or the file's blocks), and the
    embedding table reads its rows (Int8Embedding, BlockEmbedding): one copy instead of a
    bfloat16 table beside an int8 head. Its rows are the head's, within the q8 step of the
    file's (`llamablock bench memory`)."""
    release_free_memory()  # the parse's freed objects back to the system before the weights come
    model = empty_decoder(cfg)
    weights = WeightPlan(dict(formats), head, binding or ggml_kernel.matmul, grouped, dict(prefill or {}))
    plain, used, shared = _read_weights(index, cfg, model, activations, weights)
    biases = {n: b for n, b in plain.items() if n.endswith(".bias")}
    model.assign_weights({n: t for n, t in plain.items() if n not in biases})
    for name, b in biases.items():  # a packed layer keeps its bias in bfloat16, a block layer in float32
        module = model.get_submodule(name.rsplit(".", 1)[0])
        if isinstance(module, (Int8Linear, Int4Linear, BlockLinear)):
            module.bias = b.to(torch.bfloat16 if not isinstance(module, BlockLinear) else torch.float32)
        else:
            module.bias = nn.Parameter(b)
    if isinstance(shared, BlockLinear):
        model.head, model.embed = shared, BlockEmbedding(shared, activations)
    elif shared is not None:
        model.head, model.embed = shared, Int8Embedding(shared)
    elif head == "q8" and cfg.tie_embeddings:  # the tied head of a float table, q8 as quantize_model makes it
        model.head = Int8Linear(model.embed.weight, None, weights.prefill.get("q8", PREFILL_ROWS))
        used["q8"] += 1
    release_free_memory()
    return model.eval(), dict(used)

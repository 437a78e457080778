"""GGUF checkpoints (llama.cpp's single-file format), read with the `gguf` package.

A GGUF file holds metadata (architecture, sizes, tokenizer, chat template) and tensors, many
block-quantized. Loading here:
  1. opens the file with `gguf.GGUFReader` (errors: not GGUF, truncated, wrong version);
  2. builds a `ModelConfig` from the `<arch>.*` keys; an architecture that is not implemented
     is refused by name, never loaded into a model that would compute something else;
  3. dequantizes each tensor with the `gguf.quants` block kernels (the package's reference numpy
     kernels, the same ones transformers' GGUF loader calls) into float32, then casts to the
     requested dtype, a chunk of rows at a time (io/gguf_read.py);
  4. renames llama.cpp's tensors (`blk.3.attn_q.weight`) to ours (`layers.3.attn.wq.weight`);
  5. for the llama architecture, undoes the q/k row permutation of llama.cpp's converter;
  6. reads the file's RoPE scaling (rope.scaling metadata, LLaMA 3.1's rope_freqs tensor) into
     `cfg.rope_scaling` (io/gguf_rope.py).

The q/k permutation. transformers stores W_q, W_k for the "half" RoPE layout (rotate_half).
llama.cpp's convert_hf_to_gguf.py (`LlamaModel.permute`) reorders the rows of each head back to
Meta's neighbouring pairs, because llama.cpp's llama rope ("NORM" mode) rotates (x0, x1), (x2, x3):

    w.reshape(n_head, 2, head_dim // 2, d_in).swapaxes(1, 2).reshape(w.shape)     # half -> GGUF

So a llama GGUF declares the interleaved layout. By default we undo that permutation and run
the model in the "half" layout (as transformers does, whose RoPE code ours matches bit for bit);
`rope_layout="interleaved"` keeps the file's rows and rotates neighbouring pairs instead. Both
compute the same function (tested). qwen2 files are not permuted: llama.cpp rotates them in
"NEOX" mode, which is the half layout; nor are the descendants' (Gemma 1-3, Qwen3, Phi-3), whose
own metadata, fused tensors and stored norms io/gguf_families.py reads.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

from llamablock.config import ModelConfig
from llamablock.families import GGUF_ARCHS
from llamablock.io import gguf_families as fam
from llamablock.io.empty import empty_decoder
from llamablock.io.gguf_fast_reader import reader_choice
from llamablock.io.gguf_meta import REQUIRED, Metadata, number, read_metadata
from llamablock.io.gguf_read import (  # noqa: F401 (public here)
    SUPPORTED_TYPES,
    Blocks,
    RowChunks,
    TensorIndex,
    dequantize,
    dequantize_to,
    read_blocks,
)
from llamablock.io.gguf_rope import rope_scaling_from_gguf
from llamablock.io.tensor_names import (
    ROPE_FACTORS,
    ROPE_FREQS,
    gguf_layer_name,
    gguf_name,
    our_name,
)
from llamablock.model import Decoder
from llamablock.rope import permute_qk

# Architectures implemented (the family records, families.py), with the family name our config uses
# and whether the file's q/k rows are in llama.cpp's interleaved ("NORM") rope order.
ARCHITECTURES = {arch: (f.name, f.gguf_interleaved) for arch, f in GGUF_ARCHS.items()}


def open_gguf(path: str | Path):
    """A `gguf.GGUFReader`, with clear errors for a missing, non-GGUF or truncated file; its class
    is `reader_choice().reader` (io/gguf_fast_reader.py: the faster parse on a checked gguf version)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"GGUF file not found: {path}")
    with open(path, "rb") as fh:
        magic = fh.read(4)
    if magic != b"GGUF":
        raise ValueError(f"{path} is not a GGUF file (it starts with {magic!r}, a GGUF file starts with b'GGUF')")
    try:
        reader = reader_choice().reader(path)
    except Exception as e:  # the reader raises ValueError, IndexError, struct errors... on a torn header
        raise ValueError(f"{path} is not a readable GGUF file (truncated or corrupt?): {type(e).__name__}: {e}") from None
    size = os.path.getsize(path)
    for t in reader.tensors:
        if t.data_offset + t.n_bytes > size:
            raise ValueError(
                f"{path} is truncated: tensor {t.name!r} needs bytes up to {t.data_offset + t.n_bytes:,}, "
                f"the file has {size:,}; download or copy it again")
    return reader


def metadata(reader) -> Metadata:
    """All scalar and string metadata; arrays (the tokenizer's vocabulary...) only named (io/gguf_meta.py)."""
    return read_metadata(reader)


def tensor_index(reader) -> TensorIndex:
    """The reader's tensors and architecture without its parse (io/gguf_read.py): drop the reader
    after this, before reading weights."""
    drop_array_fields(reader)
    return TensorIndex(reader, metadata(reader)["general.architecture"])


def drop_array_fields(reader) -> None:
    """Forget the parsed array fields (tokenizer vocabulary, merges...) once read: several Python
    objects per entry, near a small model's weights in size, that a loader need not hold beside
    them (`llamablock bench memory`). Scalars and tensors stay; `field_array` gives None for the rest."""
    import gguf

    arrays = [key for key, f in reader.fields.items() if f.types and f.types[0] == gguf.GGUFValueType.ARRAY]
    for key in arrays:
        del reader.fields[key]


def _tensor_names(reader) -> set[str]:
    return {t.name for t in reader.tensors}


def config_from_gguf(reader, rope_scaling: bool = True) -> ModelConfig:
    """The model's config from the file's metadata; `rope_scaling=False` leaves the file's RoPE
    scaling out (for `rope_lint`, which reports a scaling that cannot be read by itself)."""
    meta = metadata(reader)
    arch = meta.get("general.architecture")
    if arch not in ARCHITECTURES:
        raise ValueError(
            f"GGUF architecture {arch!r} is not supported; llamablock implements {sorted(ARCHITECTURES)}. "
            "A different architecture would load but compute something else, so it is refused.")
    family, _ = ARCHITECTURES[arch]
    names = _tensor_names(reader)

    def get(key, default=REQUIRED, kind: type = int, positive: bool = False):
        return number(meta, f"{arch}.{key}", kind, default, positive=positive)

    d_model, n_heads = get("embedding_length", positive=True), get("attention.head_count", positive=True)
    blocks = {t.name.split(".")[1] for t in reader.tensors if t.name.startswith("blk.")}
    if get("block_count", positive=True) != len(blocks):  # before any module exists: the file bounds the model
        raise ValueError(f"GGUF metadata says {arch}.block_count = {get('block_count')}, the file holds tensors "
                         f"for {len(blocks)} blocks")
    head_dim = get("attention.key_length", d_model // n_heads, positive=True)
    value_dim = get("attention.value_length", head_dim)
    if value_dim != head_dim:
        raise ValueError(f"GGUF metadata {arch}.attention.value_length ({value_dim}) differs from "
                         f"{arch}.attention.key_length ({head_dim}); llamablock's attention, as llama.cpp's for these "
                         "architectures, needs them equal")
    tokens = reader.get_field("tokenizer.ggml.tokens")
    vocab = get("vocab_size", None)
    if vocab is not None and vocab <= 0:
        raise ValueError(f"GGUF metadata {arch}.vocab_size must be positive, got {vocab}")
    if vocab is None:
        vocab = len(tokens.data) if tokens is not None else None
    if vocab is None:
        vocab = next(t for t in reader.tensors if t.name == gguf_name("embed.weight")).shape[-1]
    rot = get("rope.dimension_count", head_dim)
    if not 0 < rot <= head_dim or rot % 2:
        raise ValueError(f"GGUF metadata {arch}.rope.dimension_count must be an even number of features in "
                         f"1..{head_dim} (the head width), got {rot}")
    fields = dict(
        vocab_size=int(vocab), d_model=d_model, n_layers=get("block_count"), n_heads=n_heads,
        n_kv_heads=get("attention.head_count_kv", n_heads, positive=True), head_dim=head_dim,
        d_ff=get("feed_forward_length", positive=True), norm="rmsnorm", norm_placement="pre",
        norm_eps=get("attention.layer_norm_rms_epsilon", kind=float, positive=True), ffn="swiglu", position="rope",
        max_seq_len=get("context_length", 2048, positive=True), rope_theta=get("rope.freq_base", 10000.0, float, positive=True),
        rope_layout="half", partial_rotary_factor=rot / head_dim,
        qkv_bias=gguf_name("layers.0.attn.wq.bias") in names, o_bias=gguf_name("layers.0.attn.wo.bias") in names,
        tie_embeddings=gguf_name("head.weight") not in names, family=family,
    )
    fields.update(fam.family_fields(GGUF_ARCHS[arch], meta, names, fields))
    try:
        cfg = ModelConfig(**fields)
    except ValueError as e:  # fields that disagree with each other: name the file's keys behind them
        keys = [f"{arch}.{k}" for field, k in _FIELD_KEYS.items() if field in str(e)]
        raise ValueError(f"GGUF metadata describes no valid model ({', '.join(keys) or 'its sizes'}): {e}") from None
    _check_shapes(cfg, reader)
    factors = {t.name: torch.from_numpy(dequantize(t)) for t in reader.tensors if t.name in ROPE_FACTORS}
    scaling = fam.phi3_longrope(arch, meta, factors)
    if scaling is None and rope_scaling:
        scaling = rope_scaling_of(reader, cfg)
    return cfg if scaling is None or not rope_scaling else cfg.replace(rope_scaling=scaling)


# ModelConfig's field -> the GGUF key it is read from (for messages)
_FIELD_KEYS = {"n_kv_heads": "attention.head_count_kv", "n_heads": "attention.head_count", "d_model": "embedding_length",
               "head_dim": "attention.key_length", "d_ff": "feed_forward_length", "n_layers": "block_count",
               "max_seq_len": "context_length", "norm_eps": "attention.layer_norm_rms_epsilon",
               "rope_theta": "rope.freq_base", "partial_rotary_factor": "rope.dimension_count",
               "sliding_window": "attention.sliding_window"}


def _check_shapes(cfg: ModelConfig, reader) -> None:
    """The metadata's sizes against the file's own tensors (embedding, block 0), before any module
    exists: a lying head count or width would otherwise size the model without bound."""
    shapes = {t.name: tuple(int(n) for n in reversed(t.shape.tolist())) for t in reader.tensors}
    want = {gguf_name("embed.weight"): (cfg.vocab_size, cfg.d_model)}
    want.update({f"blk.0.{gguf_layer_name(ours)}.weight": shape for ours, shape in cfg.layer_shapes().items()
                 if not fam.is_fused(cfg.family, gguf_layer_name(ours))})
    for name, shape in want.items():
        if name in shapes and shapes[name] != shape:
            raise ValueError(f"GGUF tensor {name!r} has shape {shapes[name]}, the metadata implies {shape}")


def rope_scaling_of(reader, cfg: ModelConfig) -> dict | None:
    """The file's RoPE scaling for `cfg` (io/gguf_rope.py), or ValueError when it is not mapped."""
    meta = metadata(reader)
    freqs = next((t for t in reader.tensors if t.name == ROPE_FREQS), None)
    return rope_scaling_from_gguf(cfg, meta, meta["general.architecture"], None if freqs is None else dequantize(freqs))


def gguf_tensors(reader, cfg: ModelConfig, expected: dict[str, torch.Size], dtype: torch.dtype = torch.float32,
                 chunked: frozenset[str] = frozenset(), as_blocks=None):
    """The file's tensors one at a time, as (our name, GGUF type, tensor of `dtype` in `cfg.rope_layout`),
    each checked against `expected` (name -> shape): a loader holds one tensor in float at a time.
    The names in `chunked` (not wq/wk, which are permuted whole) come as RowChunks, not read yet;
    those for which `as_blocks(our name, GGUF type)` is true come as the file's Blocks, undecoded
    (their rows permuted like a float tensor's: a row of blocks is one output row)."""
    arch = reader.architecture if isinstance(reader, TensorIndex) else metadata(reader)["general.architecture"]
    file_interleaved = ARCHITECTURES[arch][1]
    if cfg.rope_layout not in ("half", "interleaved"):
        raise ValueError(f"rope_layout must be 'half' or 'interleaved', got {cfg.rope_layout!r}")
    if file_interleaved and cfg.rotary_dim != cfg.head_dim:
        raise ValueError("a llama GGUF with partial rotary is not supported (llama.cpp permutes whole heads)")
    def finish(name: str, w):  # into our form: Gemma's norms unshifted, q/k rows in cfg's pair order
        w = fam.unshift_norm(arch, name, w) if isinstance(w, torch.Tensor) else w
        kind = name.split(".")[-2]
        if kind in ("wq", "wk"):  # a file in one pair order runs in the other only once permuted
            heads = cfg.n_heads if kind == "wq" else cfg.n_kv_heads
            to = ("half" if file_interleaved and cfg.rope_layout == "half" else
                  "interleaved" if not file_interleaved and cfg.rope_layout == "interleaved" else None)
            if to and isinstance(w, Blocks):
                w = Blocks(w.type_name, permute_qk(w.rows, heads, cfg.head_dim, cfg.rotary_dim, to=to), w.shape)
            elif to:
                w = permute_qk(w, heads, cfg.head_dim, cfg.rotary_dim, to=to)
        return w

    seen = set()
    for t in reader.tensors:
        if t.name == ROPE_FREQS or t.name in ROPE_FACTORS:  # read into cfg.rope_scaling by config_from_gguf
            continue
        gguf_kind = t.name.split(".")[2] if t.name.startswith("blk.") else ""
        if fam.is_fused(cfg.family, gguf_kind):  # Phi-3: one tensor holds several of ours
            parts = fam.split_gguf_fused(gguf_kind, f"layers.{t.name.split('.')[1]}", dequantize_to(t, dtype), cfg)
        else:
            name = our_name(t.name)
            chunk = name in chunked and name.split(".")[-2] not in ("wq", "wk")  # wq, wk are permuted whole
            blocks = as_blocks is not None and as_blocks(name, t.tensor_type.name)
            parts = [(name, read_blocks(t) if blocks else RowChunks(t, dtype) if chunk else dequantize_to(t, dtype))]
        for name, w in parts:
            _check_expected(t.name, name, w, expected)
            seen.add(name)
            yield name, t.tensor_type.name, finish(name, w)
    missing = sorted(set(expected) - seen - ({"head.weight"} if cfg.tie_embeddings else set()))
    if missing:
        raise ValueError(f"GGUF file lacks tensors the model needs: {missing[:5]}")


def _check_expected(gguf_name: str, name: str, w, expected: dict) -> None:
    if name not in expected:
        raise ValueError(f"GGUF tensor {gguf_name!r} ({name}) is not used by the configured model")
    if tuple(w.shape) != tuple(expected[name]):
        raise ValueError(f"GGUF tensor {gguf_name!r} has shape {tuple(w.shape)}, the metadata implies "
                         f"{tuple(expected[name])}")


def gguf_decoder(reader, cfg: ModelConfig, dtype: torch.dtype = torch.float32) -> Decoder:
    """A `Decoder` of `cfg` with the tensors of `reader` (an open GGUFReader or its TensorIndex)
    dequantized to `dtype`."""
    model = empty_decoder(cfg)
    expected = {name: p.shape for name, p in model.state_dict(keep_vars=True).items()}
    state = {name: w for name, _, w in gguf_tensors(reader, cfg, expected, dtype)}
    return model.assign_weights(state)


def load_gguf(path: str | Path, dtype: torch.dtype = torch.float32, rope_layout: str = "half") -> Decoder:
    """A `Decoder` with the file's weights dequantized to `dtype`, running in `rope_layout`."""
    reader = open_gguf(path)
    return gguf_decoder(reader, config_from_gguf(reader).replace(rope_layout=rope_layout), dtype)


def llamacpp_permute(w: torch.Tensor, n_head: int) -> torch.Tensor:
    """The permutation llama.cpp's converter applies to W_q/W_k (half -> interleaved rows).

    Restated from convert_hf_to_gguf.py `LlamaModel.permute` (for W_k it is called with the
    kv head count): reshape(n_head, 2, rows // n_head // 2, ...).swapaxes(1, 2).
    """
    rows = w.shape[0]
    return w.reshape(n_head, 2, rows // n_head // 2, *w.shape[1:]).transpose(1, 2).reshape(w.shape)

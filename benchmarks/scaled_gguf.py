"""Larger GGUFs of the embedded one's kind, for `bench memory` and `bench size`: random weights,
real layout.

The only real quantized file on this machine is SmolLM2-135M's (94 MiB), where the libraries and
the tokenizer are a large share of a run's memory and a decode step is bound by arithmetic, not
by memory. To show how a run scales with the file, this writes a file with the embedded one's
metadata (tokenizer included) at other sizes, in the embedded file's own tensor types (Q4_1
matrices, a Q8_0 embedding, F32 norms) or in a type mix that llama.cpp's `llama-quantize` writes
(MIXES): the loader reads it as it would a downloaded file. The weights are random (std 0.02; K
types: random blocks with modest scales, as the `gguf` package cannot quantize them), so the text
it generates means nothing; memory and speed do not depend on the values. Written with the `gguf`
package's writer and quantizers, as llama.cpp's converter does.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

SIZE_KEYS = ("block_count", "embedding_length", "feed_forward_length", "attention.head_count",
             "attention.head_count_kv", "rope.dimension_count")
MIXES = ("Q4_K_M", "Q4_0", "Q8_0")
K_BLOCK_BYTES = {"Q4_K": 144, "Q5_K": 176, "Q6_K": 210}  # per 256 weights (ggml-common.h)


def random_kquant_blocks(kind: str, rows: int, cols: int, seed: int = 0) -> np.ndarray:
    """Random K-quant blocks with finite, modest fp16 scales (gguf cannot quantize K types).

    Layouts (bytes per 256-value block), from ggml-common.h: Q4_K = d, dmin (fp16), 12 scale bytes,
    128 nibble bytes; Q5_K adds 32 high-bit bytes before the nibbles; Q6_K = 128 low, 64 high,
    16 int8 scales, then d (fp16) last.
    """
    n = rows * cols // 256
    rng = np.random.default_rng(seed)
    b = rng.integers(0, 256, size=(n, K_BLOCK_BYTES[kind]), dtype=np.uint8)
    scale = lambda k: (rng.uniform(1e-4, 2e-3, size=(n, k))).astype(np.float16).view(np.uint8)  # noqa: E731
    if kind == "Q6_K":
        b[:, -2:] = scale(1)
    else:
        b[:, :4] = scale(2)
    return b.reshape(rows, cols // 256 * K_BLOCK_BYTES[kind])


def _more_bits(layer: int, layers: int) -> bool:
    """llama-quantize's use_more_bits: the first and last eighth of the layers, and every third between."""
    return layer < layers // 8 or layer >= 7 * layers // 8 or (layer - layers // 8) % 3 == 2


def mix_type(mix: str, part: str, layer: int, layers: int, tied: bool) -> str:
    """The GGML type llama-quantize (llama_tensor_get_type) gives tensor `part` of layer `layer` in
    a file of type `mix`: the output matrix (or a tied embedding, which is the output) Q6_K unless
    the file is Q8_0; for Q4_K_M, attn_v and ffn_down Q6_K in the layers given more bits."""
    base = "Q4_K" if mix == "Q4_K_M" else mix
    if part == "output" or (part == "token_embd" and tied):
        return "Q8_0" if mix == "Q8_0" else "Q6_K"
    if mix == "Q4_K_M" and part in ("attn_v", "ffn_down") and _more_bits(layer, layers):
        return "Q6_K"
    return base


def write_scaled(src: Path, out: Path, d_model: int, n_layers: int, n_heads: int, n_kv_heads: int, d_ff: int,
                 mix: str | None = None, untied: bool = False) -> Path:
    """`out`: `src`'s metadata at d_model / n_layers / n_heads / n_kv_heads / d_ff, in `src`'s tensor
    types (mix None) or llama-quantize's `mix` (MIXES); `untied` adds an output matrix of its own.
    Every matrix random, every norm ones."""
    import gguf

    reader = gguf.GGUFReader(src)
    arch = reader.fields["general.architecture"].contents()
    head_dim = d_model // n_heads
    sizes = dict(zip(SIZE_KEYS, (n_layers, d_model, d_ff, n_heads, n_kv_heads, head_dim), strict=True))
    meta = {k: f.contents() for k, f in reader.fields.items()}
    vocab = meta[f"{arch}.vocab_size"] if f"{arch}.vocab_size" in meta else len(meta["tokenizer.ggml.tokens"])
    shapes = {"token_embd": (vocab, d_model), "output": (vocab, d_model), "attn_q": (d_model, d_model),
              "attn_k": (n_kv_heads * head_dim, d_model), "attn_v": (n_kv_heads * head_dim, d_model),
              "attn_output": (d_model, d_model), "ffn_gate": (d_ff, d_model), "ffn_up": (d_ff, d_model),
              "ffn_down": (d_model, d_ff)}
    own = {t.name.split(".")[-2]: t.tensor_type.name for t in reader.tensors}  # e.g. "ffn_up" -> "Q4_1"
    own.setdefault("output", own["token_embd"])

    writer = gguf.GGUFWriter(out, arch)
    for key, field in reader.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture":
            continue  # the writer writes these itself
        size = key.removeprefix(f"{arch}.")
        value = sizes[size] if size in SIZE_KEYS else field.contents()
        sub = field.types[-1] if field.types[0] == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(key, value, field.types[0], sub_type=sub)
    rng = np.random.default_rng(0)
    tensors = [("token_embd.weight", "token_embd", -1)]
    tensors += [(f"blk.{i}.{kind}.weight", kind, i) for i in range(n_layers)
                for kind in ("attn_norm", "attn_q", "attn_k", "attn_v", "attn_output", "ffn_norm", "ffn_gate", "ffn_up",
                             "ffn_down")]
    tensors += [("output_norm.weight", "output_norm", -1)] + ([("output.weight", "output", -1)] if untied else [])
    for i, (name, kind, layer) in enumerate(tensors):
        if kind.endswith("norm"):
            writer.add_tensor(name, np.ones(d_model, dtype=np.float32))
            continue
        ggml = own[kind] if mix is None else mix_type(mix, kind, layer, n_layers, tied=not untied)
        if ggml in K_BLOCK_BYTES:
            blocks = random_kquant_blocks(ggml, *shapes[kind], seed=i)
        else:
            w = rng.standard_normal(shapes[kind], dtype=np.float32) * 0.02
            blocks = gguf.quants.quantize(w, gguf.GGMLQuantizationType[ggml])
        writer.add_tensor(name, blocks, raw_dtype=gguf.GGMLQuantizationType[ggml])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out

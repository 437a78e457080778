"""A larger GGUF of the same kind as the embedded one, for `bench memory`: random weights, real layout.

The only real quantized file on this machine is SmolLM2-135M's (94 MiB), where the libraries and
the tokenizer are a large share of a run's memory. To show how the peak scales with the file,
this writes a file with the embedded one's metadata (tokenizer included) and tensor types
(Q4_1 matrices, a Q8_0 embedding, F32 norms), at other sizes: the loader reads it as it would a
downloaded file. The weights are random (std 0.02), so the text it generates means nothing;
memory and speed do not depend on the values. Written with the `gguf` package's writer and
quantizers, as llama.cpp's converter does.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

SIZE_KEYS = ("block_count", "embedding_length", "feed_forward_length", "attention.head_count",
             "attention.head_count_kv", "rope.dimension_count")


def write_scaled(src: Path, out: Path, d_model: int, n_layers: int, n_heads: int, n_kv_heads: int, d_ff: int) -> Path:
    """`out`: `src`'s metadata and tensor types at d_model / n_layers / n_heads / n_kv_heads / d_ff;
    every matrix random, every norm ones."""
    import gguf

    reader = gguf.GGUFReader(src)
    arch = reader.fields["general.architecture"].contents()
    meta = {k: f.contents() for k, f in reader.fields.items()}
    head_dim = d_model // n_heads
    sizes = dict(zip(SIZE_KEYS, (n_layers, d_model, d_ff, n_heads, n_kv_heads, head_dim), strict=True))
    vocab = meta[f"{arch}.vocab_size"] if f"{arch}.vocab_size" in meta else len(meta["tokenizer.ggml.tokens"])
    shapes = {"token_embd": (vocab, d_model), "attn_q": (d_model, d_model), "attn_k": (n_kv_heads * head_dim, d_model),
              "attn_v": (n_kv_heads * head_dim, d_model), "attn_output": (d_model, d_model), "ffn_gate": (d_ff, d_model),
              "ffn_up": (d_ff, d_model), "ffn_down": (d_model, d_ff)}
    types = {t.name.split(".")[-2]: t.tensor_type for t in reader.tensors}  # e.g. "ffn_up" -> Q4_1

    writer = gguf.GGUFWriter(out, arch)
    for key, field in reader.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture":
            continue  # the writer writes these itself
        size = key.removeprefix(f"{arch}.")
        value = sizes[size] if size in SIZE_KEYS else field.contents()
        sub = field.types[-1] if field.types[0] == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(key, value, field.types[0], sub_type=sub)
    rng = np.random.default_rng(0)
    tensors = [("token_embd.weight", "token_embd")]
    tensors += [(f"blk.{i}.{kind}.weight", kind) for i in range(n_layers)
                for kind in ("attn_norm", "attn_q", "attn_k", "attn_v", "attn_output", "ffn_norm", "ffn_gate", "ffn_up",
                             "ffn_down")]
    tensors.append(("output_norm.weight", "output_norm"))
    for name, kind in tensors:
        if kind.endswith("norm"):
            writer.add_tensor(name, np.ones(d_model, dtype=np.float32))
            continue
        w = (rng.standard_normal(shapes[kind], dtype=np.float32) * 0.02)
        writer.add_tensor(name, gguf.quants.quantize(w, types[kind]), raw_dtype=types[kind])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out

"""Tiny GGUF files written with the `gguf` package's own writer, for loader tests.

`write_tiny_gguf` takes transformers-layout weights (q/k rows for rotate_half) and, for the llama
architecture, applies llama.cpp's converter permutation before writing, exactly as
convert_hf_to_gguf.py would. Weights may be quantized with `gguf.quants.quantize`, or written as
raw blocks (for the K-quants, which the package can only dequantize).
"""

from __future__ import annotations

import gguf
import numpy as np
import torch

from benchmarks.scaled_gguf import random_kquant_blocks  # noqa: F401  (tests import it from here)
from llamablock.io.gguf import llamacpp_permute

HF_TO_GGUF = {
    "model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight",
}
LAYER = {"input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm", "self_attn.q_proj": "attn_q",
         "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
         "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}


def gguf_name(hf: str) -> str:
    if hf in HF_TO_GGUF:
        return HF_TO_GGUF[hf]
    _, _, i, *mid, kind = hf.split(".")
    return f"blk.{i}.{LAYER['.'.join(mid)]}.{kind}"


def tiny_vocab(n: int) -> tuple[list[str], list[str]]:
    """A byte-level vocabulary: printable ASCII, space and newline, padded to n, the last token
    the one merge '!' + '"' (llama.cpp refuses a BPE vocabulary without merges)."""
    base = [chr(c) for c in range(ord("!"), ord("~") + 1)] + ["\u0120", "\u010a"]  # + space, newline (GPT-2 spelling)
    tokens = (base + [f"<extra_{i}>" for i in range(n - len(base))])[:n]
    tokens[-1] = '!"'
    return tokens, ['! "']


def add_shape_and_vocab(w, cfg, head_dim: int, rotary_dim: int, theta: float) -> None:
    """The metadata every architecture's converter writes (sizes, RoPE base), and the byte-level
    vocabulary of `tiny_vocab` with BOS 0 and EOS 1."""
    w.add_block_count(cfg.num_hidden_layers)
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(cfg.num_key_value_heads)
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    w.add_rope_dimension_count(rotary_dim)
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_rope_freq_base(float(theta))
    w.add_vocab_size(cfg.vocab_size)
    tokens, merges = tiny_vocab(cfg.vocab_size)
    w.add_tokenizer_model("gpt2")
    w.add_token_list(tokens)
    w.add_token_merges(merges)
    w.add_bos_token_id(0)
    w.add_eos_token_id(1)


def write_tiny_gguf(path, hf_model, arch: str = "llama", qtype: str = "F32", raw_blocks: dict | None = None,
                    extra_kv: dict | None = None, rope_freqs: np.ndarray | None = None) -> dict[str, np.ndarray]:
    """Write hf_model (a tiny transformers Llama/Qwen2) as GGUF; returns what was written per tensor.

    extra_kv: more metadata (str, int -> uint32, float -> float32, as llama.cpp types them);
    rope_freqs: LLaMA 3.1's per-pair RoPE divisors, written as the converter writes them."""
    cfg = hf_model.config
    w = gguf.GGUFWriter(str(path), arch)
    add_shape_and_vocab(w, cfg, cfg.head_dim, cfg.head_dim, cfg.rope_parameters["rope_theta"])
    for k, v in (extra_kv or {}).items():
        if isinstance(v, str):
            w.add_string(k, v)
        elif isinstance(v, int):
            w.add_uint32(k, v)
        else:
            w.add_float32(k, float(v))
    if rope_freqs is not None:
        w.add_tensor("rope_freqs.weight", np.asarray(rope_freqs, dtype=np.float32))
    written = {}
    for name, p in hf_model.state_dict().items():
        if cfg.tie_word_embeddings and name == "lm_head.weight":
            continue
        t = p.detach().float()
        if arch == "llama" and ("q_proj" in name or "k_proj" in name):
            heads = cfg.num_attention_heads if "q_proj" in name else cfg.num_key_value_heads
            t = llamacpp_permute(t, heads)
        arr = t.numpy().astype(np.float32)
        g = gguf_name(name)
        written[g] = arr
        kind = qtype if arr.ndim == 2 else "F32"  # llama.cpp keeps norms in F32
        if raw_blocks and g in raw_blocks:
            blocks, kind_raw = raw_blocks[g]
            w.add_tensor(g, blocks, raw_dtype=gguf.GGMLQuantizationType[kind_raw])  # shape from the block bytes
            written[g] = gguf.quants.dequantize(blocks, gguf.GGMLQuantizationType[kind_raw]).reshape(arr.shape)
        elif kind == "F32":
            w.add_tensor(g, arr)
        elif kind == "F16":
            w.add_tensor(g, arr.astype(np.float16))
        else:
            q = gguf.GGMLQuantizationType[kind]
            w.add_tensor(g, gguf.quants.quantize(arr, q), raw_dtype=q)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return written


def to_torch(a: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(a))


def count_gguf_opens(monkeypatch) -> list:
    """The paths `open_gguf` is called with from now on (a parse of the header each)."""
    return count_calls(monkeypatch, "open_gguf")


def count_calls(monkeypatch, name: str) -> list:
    """The first argument of every call of llamablock's function `name` from now on. It is replaced
    in every llamablock module that holds it, however imported (`from x import name`, or looked
    up on its module inside a function), so no call path escapes the count."""
    import sys

    calls, real = [], None
    for module in [m for n, m in list(sys.modules.items()) if n.startswith("llamablock") and m is not None]:
        if callable(getattr(module, name, None)):
            real = real or getattr(module, name)
    assert real is not None, f"no llamablock module defines {name}"

    def counted(*args, **kwargs):
        calls.append(args[0] if args else None)
        return real(*args, **kwargs)

    for module in [m for n, m in list(sys.modules.items()) if n.startswith("llamablock") and m is not None]:
        if getattr(module, name, None) is real:
            monkeypatch.setattr(module, name, counted)
    return calls

"""Tiny GGUF files of the block's descendants, written as llama.cpp's converter writes them.

Tensor names come from the `gguf` package's own `TensorNameMap` (the table convert_hf_to_gguf.py
uses); the rest follows the converter's model classes: Gemma's norms are stored as 1 + w
(`GemmaModel.modify_tensors`); Gemma 2 writes both soft-caps and the window; Gemma 3 the window and
its global layers' linear scaling; Phi-3 its fused qkv and gate_up weights as `attn_qkv` and
`ffn_up`, and LongRoPE as two factor tensors with the original length and attention factor
(`Phi3MiniModel`). None of these architectures permutes q/k rows (llama.cpp rotates them in NEOX
mode, the half layout). Sizes and the byte-level vocabulary are gguf_tiny's.
"""

from __future__ import annotations

import math

import gguf
import numpy as np
from gguf_tiny import add_shape_and_vocab

ARCH = {"qwen3": "QWEN3", "gemma": "GEMMA", "gemma2": "GEMMA2", "gemma3_text": "GEMMA3", "phi3": "PHI3"}


def _rope(cfg, family: str) -> dict:
    params = cfg.rope_parameters
    return params["full_attention"] if family == "gemma3_text" else params


def write_family_gguf(path, hf_model, family: str, qtype: str = "F32") -> None:
    cfg = hf_model.config
    arch = gguf.MODEL_ARCH[ARCH[family]]
    names = gguf.TensorNameMap(arch, cfg.num_hidden_layers)
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    rope = _rope(cfg, family)
    w = gguf.GGUFWriter(str(path), gguf.MODEL_ARCH_NAMES[arch])
    add_shape_and_vocab(w, cfg, head_dim, int(head_dim * rope.get("partial_rotary_factor", 1.0)), rope["rope_theta"])
    if family == "gemma2":
        w.add_attn_logit_softcapping(cfg.attn_logit_softcapping)
        w.add_final_logit_softcapping(cfg.final_logit_softcapping)
    if getattr(cfg, "sliding_window", None) is not None:
        w.add_sliding_window(cfg.sliding_window)
    if family == "gemma3_text" and rope.get("rope_type") == "linear":
        w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        w.add_rope_scaling_factor(rope["factor"])
    if family == "phi3" and rope.get("rope_type") == "longrope":
        orig = cfg.original_max_position_embeddings
        scale = cfg.max_position_embeddings / orig
        w.add_rope_scaling_attn_factors(1.0 if scale <= 1 else math.sqrt(1 + math.log(scale) / math.log(orig)))
        w.add_rope_scaling_orig_ctx_len(orig)
        w.add_tensor("rope_factors_long.weight", np.asarray(rope["long_factor"], dtype=np.float32))
        w.add_tensor("rope_factors_short.weight", np.asarray(rope["short_factor"], dtype=np.float32))
    for name, p in hf_model.state_dict().items():
        if cfg.tie_word_embeddings and name == "lm_head.weight":
            continue
        arr = p.detach().float().numpy().astype(np.float32)
        if family.startswith("gemma") and name.endswith("norm.weight"):
            arr = arr + 1  # the converter stores Gemma's (1 + w)
        g = names.get_name(name, try_suffixes=(".weight", ".bias"))
        if arr.ndim == 2 and qtype != "F32":
            q = gguf.GGMLQuantizationType[qtype]
            w.add_tensor(g, gguf.quants.quantize(arr, q), raw_dtype=q)
        else:
            w.add_tensor(g, arr)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()

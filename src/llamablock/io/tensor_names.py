"""Every file format's tensor names beside ours, in one place: the readers and writers import these.

Our parameter names are short (`layers.3.attn.wq.weight`, model.py). transformers names the same
tensor `model.layers.3.self_attn.q_proj.weight`, llama.cpp `blk.3.attn_q.weight` (its
convert_hf_to_gguf.py / gguf-py `tensor_mapping.py`). Gemma 2 and 3 name their four norms
input_layernorm, post_attention_layernorm (after attention), pre_ and post_feedforward_layernorm,
so `post_attention_layernorm` is our norm2 in LLaMA and our post_norm1 there. Phi-3 stores q|k|v
and gate|up fused, one tensor each (rows in the order listed); the readers split them.
"""

from __future__ import annotations

import re

# transformers: ours -> theirs, inside "model.layers.N."
HF_LAYER = {
    "attn.wq": "self_attn.q_proj", "attn.wk": "self_attn.k_proj", "attn.wv": "self_attn.v_proj",
    "attn.wo": "self_attn.o_proj", "ffn.w_gate": "mlp.gate_proj", "ffn.w_up": "mlp.up_proj",
    "ffn.w_down": "mlp.down_proj", "norm1": "input_layernorm", "norm2": "post_attention_layernorm",
    "attn.q_norm": "self_attn.q_norm", "attn.k_norm": "self_attn.k_norm",
}
HF_SANDWICH = {"norm1": "input_layernorm", "post_norm1": "post_attention_layernorm",
               "norm2": "pre_feedforward_layernorm", "post_norm2": "post_feedforward_layernorm"}
HF_FUSED = {"self_attn.qkv_proj": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
            "mlp.gate_up_proj": ("mlp.gate_proj", "mlp.up_proj")}  # Phi-3: rows in this order
HF_TOP = {"embed.weight": "model.embed_tokens.weight", "final_norm.weight": "model.norm.weight",
          "head.weight": "lm_head.weight"}

# GGUF (llama.cpp): theirs -> ours, inside "blk.N."
GGUF_LAYER = {
    "attn_norm": "norm1", "ffn_norm": "norm2", "attn_q": "attn.wq", "attn_k": "attn.wk", "attn_v": "attn.wv",
    "attn_output": "attn.wo", "ffn_gate": "ffn.w_gate", "ffn_up": "ffn.w_up", "ffn_down": "ffn.w_down",
    "attn_q_norm": "attn.q_norm", "attn_k_norm": "attn.k_norm", "post_attention_norm": "post_norm1",
    "post_ffw_norm": "post_norm2",
}
GGUF_FUSED = {"attn_qkv": ("attn.wq", "attn.wk", "attn.wv"), "ffn_up": ("ffn.w_gate", "ffn.w_up")}  # Phi-3's rows
GGUF_TOP = {"token_embd.weight": "embed.weight", "output_norm.weight": "final_norm.weight",
            "output.weight": "head.weight"}
ROPE_FREQS = "rope_freqs.weight"  # LLaMA 3.1's per-pair RoPE divisors (io/gguf_rope.py)
ROPE_FACTORS = ("rope_factors_long.weight", "rope_factors_short.weight")  # Phi-3's LongRoPE

_OURS_TO_GGUF = {ours: theirs for theirs, ours in GGUF_LAYER.items()}
_GGUF_TOP_OF = {ours: theirs for theirs, ours in GGUF_TOP.items()}


def hf_name(name: str, sandwich: bool = False) -> str:
    """transformers' name for our parameter `name`; `sandwich`: Gemma 2 and 3's four norms."""
    if name in HF_TOP:
        return HF_TOP[name]
    m = re.fullmatch(r"layers\.(\d+)\.(\w+\.\w+|\w*norm\d)\.(weight|bias)", name)
    table = {**HF_LAYER, **(HF_SANDWICH if sandwich else {})}
    if not m or m.group(2) not in table:
        raise ValueError(f"parameter {name!r} has no transformers name (only pre-LN RMSNorm families export)")
    return f"model.layers.{m.group(1)}.{table[m.group(2)]}.{m.group(3)}"


def our_name(gguf_name: str) -> str:
    """llama.cpp tensor name -> ours, e.g. blk.3.attn_q.weight -> layers.3.attn.wq.weight."""
    if gguf_name in GGUF_TOP:
        return GGUF_TOP[gguf_name]
    parts = gguf_name.split(".")
    if len(parts) == 4 and parts[0] == "blk" and parts[1].isdigit() and parts[2] in GGUF_LAYER:
        return f"layers.{parts[1]}.{GGUF_LAYER[parts[2]]}.{parts[3]}"
    raise ValueError(f"GGUF tensor {gguf_name!r} has no counterpart in llamablock's model")


def gguf_name(name: str) -> str:
    """Ours -> llama.cpp's, e.g. layers.3.attn.wq.weight -> blk.3.attn_q.weight."""
    if name in _GGUF_TOP_OF:
        return _GGUF_TOP_OF[name]
    _, i, *mid, kind = name.split(".")
    return f"blk.{i}.{_OURS_TO_GGUF['.'.join(mid)]}.{kind}"


def gguf_layer_name(ours: str) -> str:
    """llama.cpp's name inside a block for ours inside a layer, e.g. attn.wq -> attn_q."""
    return _OURS_TO_GGUF[ours]


def split_rows(w, parts: tuple[str, ...], cfg, what: str) -> tuple:
    """A fused weight's rows (a tensor) as our `parts` ("attn.wq", ...), each as many rows as
    cfg.layer_shapes says, in order (views, no copy); `what` names the tensor in the error when the
    count differs. Phi-3's fused projections, in a transformers directory and in a GGUF file."""
    sizes = [cfg.layer_shapes()[p][0] for p in parts]
    if w.shape[0] != sum(sizes):
        raise ValueError(f"tensor {what!r} has {w.shape[0]} rows; the config implies {sum(sizes)} "
                         f"({' + '.join(map(str, sizes))})")
    return w.split(sizes)

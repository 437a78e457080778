"""The families: one record each, the only place a family's names and constants are written.

A record says what the family is called in transformers' config.json (model_type, class) and in
llama.cpp's GGUF files (general.architecture), the defaults each assumes where its file is silent,
and which of config.py's switches it sets (norm offset, embedding scale, caps, local/global
layers, fused tensors, biases). The translations read these records (io/hf_config.py for
config.json, io/gguf_families.py and io/gguf.py for GGUF), and so do the presets: the maths
(model, blocks, attention, norm) reads ModelConfig's fields only, never the family's name, so
adding a family is one record here plus whatever maths is new.

Sources: transformers 5's `configuration_<family>.py` defaults and modeling files; llama.cpp's
`convert_hf_to_gguf.py` (what a file holds) and `llama-model.cpp` (what its loader assumes).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Family:
    name: str                                # ModelConfig.family, and transformers' model_type
    architecture: str | None = None          # transformers' class; None: no transformers equivalent
    gguf: str | None = None                  # llama.cpp's general.architecture; None: not read from GGUF
    gguf_interleaved: bool = False           # llama.cpp rotates it in NORM mode: q/k rows permuted in the file
    # Defaults where config.json is silent (transformers' own, per family)
    head_dim: int | None = None              # None: hidden_size / num_attention_heads
    norm_eps: float = 1e-6                   # rms_norm_eps
    tied: bool = False                       # tie_word_embeddings
    rope_theta: float = 10_000.0             # the (global layers') RoPE base
    # The block
    ffn: str = "swiglu"                      # what a GGUF file implies (config.json names its activation)
    norm_offset: float = 0.0                 # RMSNorm scales stored as w, applied as offset + w (Gemma: 1)
    embed_scaled: bool = False               # embeddings times sqrt(d_model) (Gemma)
    qkv_bias: bool = False                   # q, k, v biased whatever config.json says (Qwen2)
    o_bias: bool = False                     # config.json's attention_bias biases o too, not only q, k, v
    mlp_bias: bool = False                   # config.json's mlp_bias: biases on the three MLP matrices
    fused: bool = False                      # q|k|v and gate|up stored as one tensor each (Phi-3)
    # The descendants (config.py): norms, caps, query scale
    qk_norm: bool = False                    # RMSNorm over each head's q and k
    sandwich: bool = False                   # a norm after each sub-layer as well as before it
    query_pre_attn_scalar: float | None = None  # its default; None: not read (scores scaled by head_dim)
    softcaps: dict[str, float | None] = field(default_factory=dict)  # cap keys read -> default (None: off)
    # Windows: which layers config.json's sliding_window reaches
    window: str | None = None                # "all" layers, "upper" (max_window_layers on), "local" (a pattern)
    sliding_window: int | None = None        # its default when the key is absent
    window_from: int | None = None           # "upper": max_window_layers' default
    global_every: int | None = None          # "local": one global layer in every so many, the last of each
    global_every_key: str | None = None      # the config.json key that may change global_every
    local_rope_theta: float | None = None    # the local layers' own RoPE base where the file is silent
    # Odd ones
    multimodal: str | None = None            # model_type of the multimodal checkpoint whose text_config this is
    original_top_level: bool = False         # original_max_position_embeddings written at the top level
    gguf_longrope: bool = False              # LongRoPE's factors as tensors in the GGUF file
    gguf_27b_blocks: int | None = None       # block count of the 27B model, whose queries llama.cpp scales by (d/h)^-1/2

    def layer_pattern(self, n_layers: int, every: int | None = None) -> list[str]:
        """"full"/"sliding" per layer: one global layer closing each group of `every` (the family's)."""
        every = every or self.global_every
        return ["full" if (i + 1) % every == 0 else "sliding" for i in range(n_layers)]

    def fields(self, d_model: int, n_layers: int) -> dict:
        """The ModelConfig fields the family fixes, before a file's keys add the model's own values:
        what a preset of the family starts from (`layer_types` needs the window, so it is left out)."""
        return dict(family=self.name, ffn=self.ffn, norm_offset=self.norm_offset, tie_embeddings=self.tied,
                    embed_scale=math.sqrt(d_model) if self.embed_scaled else None, qkv_bias=self.qkv_bias,
                    qk_norm=self.qk_norm, sandwich_norm=self.sandwich,
                    query_pre_attn_scalar=self.query_pre_attn_scalar, local_rope_theta=self.local_rope_theta)


_GEMMA = dict(tied=True, ffn="geglu", norm_offset=1.0, embed_scaled=True)
_GEMMA_2_3 = dict(_GEMMA, head_dim=256, o_bias=True, sandwich=True, query_pre_attn_scalar=256.0,
                  window="local", sliding_window=4096)

FAMILIES: dict[str, Family] = {f.name: f for f in (
    Family("llama", "LlamaForCausalLM", gguf="llama", gguf_interleaved=True, o_bias=True, mlp_bias=True),
    Family("mistral", "MistralForCausalLM", window="all"),  # llama.cpp writes Mistral as "llama"
    Family("qwen2", "Qwen2ForCausalLM", gguf="qwen2", qkv_bias=True, window="upper", sliding_window=4096,
           window_from=28),
    Family("qwen3", "Qwen3ForCausalLM", gguf="qwen3", head_dim=128, o_bias=True, qk_norm=True,
           window="upper", sliding_window=4096, window_from=28),
    Family("gemma", "GemmaForCausalLM", gguf="gemma", **_GEMMA),
    Family("gemma2", "Gemma2ForCausalLM", gguf="gemma2", global_every=2, gguf_27b_blocks=46,
           softcaps={"attn_logit_softcapping": 50.0, "final_logit_softcapping": 30.0}, **_GEMMA_2_3),
    # Gemma 3 caps the logits only when asked, never the scores; its RoPE rotates whole heads.
    Family("gemma3_text", "Gemma3ForCausalLM", gguf="gemma3", qk_norm=True, global_every=6,
           global_every_key="sliding_window_pattern", rope_theta=1_000_000.0, local_rope_theta=10_000.0,
           softcaps={"final_logit_softcapping": None}, multimodal="gemma3", gguf_27b_blocks=62, **_GEMMA_2_3),
    Family("phi3", "Phi3ForCausalLM", gguf="phi3", norm_eps=1e-5, fused=True, window="all",
           original_top_level=True, gguf_longrope=True),
    Family("llamablock"),  # the module's own models (presets, training): no file format of another project
)}

# transformers' model_type -> family; llama.cpp's architecture -> family
HF_TYPES = {f.name: f for f in FAMILIES.values() if f.architecture}
GGUF_ARCHS = {f.gguf: f for f in FAMILIES.values() if f.gguf}

"""Named configurations, looked up by exact name.

The published ones copy the values of each model's config.json on the Hugging Face hub
(meta-llama, mistralai, Qwen, google, HuggingFaceTB; Gemma 3's text_config); the two small ones are this project's
Shakespeare pair of section 15.6, sized to equal parameter counts (tests check within 2%).
"""

from __future__ import annotations

from llamablock.config import ModelConfig
from llamablock.families import FAMILIES

_LLAMA3_8B = dict(vocab_size=128256, d_model=4096, n_layers=32, n_heads=32, n_kv_heads=8, d_ff=14336,
                  norm_eps=1e-5, rope_theta=500000.0, max_seq_len=8192, family="llama")

PRESETS: dict[str, dict] = {
    "llama-2-7b": dict(vocab_size=32000, d_model=4096, n_layers=32, n_heads=32, n_kv_heads=32, d_ff=11008,
                       norm_eps=1e-5, rope_theta=10000.0, max_seq_len=4096, family="llama"),
    "llama-3-8b": _LLAMA3_8B,
    "llama-3.1-8b": {**_LLAMA3_8B, "max_seq_len": 131072, "rope_scaling": {
        "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192}},
    "mistral-7b": dict(vocab_size=32000, d_model=4096, n_layers=32, n_heads=32, n_kv_heads=8, d_ff=14336,
                       norm_eps=1e-5, rope_theta=10000.0, max_seq_len=32768, sliding_window=4096,
                       family="mistral"),
    "qwen2.5-0.5b": dict(vocab_size=151936, d_model=896, n_layers=24, n_heads=14, n_kv_heads=2, d_ff=4864,
                         norm_eps=1e-6, rope_theta=1000000.0, max_seq_len=32768, qkv_bias=True,
                         tie_embeddings=True, family="qwen2"),
    # Gemma's own settings (GeGLU, 1 + w norms, scaled and tied embeddings) from its family record.
    "gemma-2b": dict(FAMILIES["gemma"].fields(2048, 18), vocab_size=256000, d_model=2048, n_layers=18, n_heads=8,
                     n_kv_heads=1, head_dim=256, d_ff=16384, norm_eps=1e-6, rope_theta=10000.0, max_seq_len=8192),
    # Gemma 3 4B's language model (text_config): the family's five sliding layers (here window 1024,
    # base 10,000) to each global one (base 1,000,000, linear scaling 8), q/k and sandwich norms.
    "gemma-3-4b": dict(FAMILIES["gemma3_text"].fields(2560, 34), vocab_size=262208, d_model=2560, n_layers=34,
                       n_heads=8, n_kv_heads=4, head_dim=256, d_ff=10240, norm_eps=1e-6, rope_theta=1_000_000.0,
                       rope_scaling={"rope_type": "linear", "factor": 8.0}, max_seq_len=131072, sliding_window=1024,
                       layer_types=FAMILIES["gemma3_text"].layer_pattern(34)),
    # The same name as the embedded checkpoint (llamablock.io.resolve), whose architecture this is.
    "smollm2-135m-instruct": dict(vocab_size=49152, d_model=576, n_layers=30, n_heads=9, n_kv_heads=3,
                                  d_ff=1536, norm_eps=1e-5, rope_theta=100000.0, max_seq_len=8192,
                                  tie_embeddings=True, family="llama"),
    # Section 15.6's pair, character-level Shakespeare. 2017: learned positions, post-LN
    # LayerNorm, ReLU MLP at 4d, biases everywhere, MHA, tied embeddings.
    "gpt-2017-small": dict(vocab_size=128, d_model=256, n_layers=4, n_heads=8, n_kv_heads=8, d_ff=1024,
                           norm="layernorm", norm_placement="post", norm_eps=1e-5, ffn="relu",
                           position="learned", max_seq_len=256, qkv_bias=True, o_bias=True, mlp_bias=True,
                           tie_embeddings=True),
    # 2024: RoPE (the module's neighbouring-pair layout), pre-LN RMSNorm, SwiGLU at 8/3 d
    # rounded to 256 (768), query heads sharing key-value heads in pairs, no biases, untied.
    "llama-2024-small": dict(vocab_size=128, d_model=256, n_layers=4, n_heads=8, n_kv_heads=4, d_ff=768,
                             norm="rmsnorm", norm_placement="pre", norm_eps=1e-5, ffn="swiglu",
                             position="rope", rope_layout="interleaved", max_seq_len=256),
}


# The Shakespeare pair by architecture year (`llamablock train --arch`, the tracer).
ARCH_PRESETS = {"2017": "gpt-2017-small", "2024": "llama-2024-small"}


def preset(name: str, **overrides) -> ModelConfig:
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; known presets: {', '.join(sorted(PRESETS))}")
    return ModelConfig(**{**PRESETS[name], **overrides})

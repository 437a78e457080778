"""Translate between `ModelConfig` and transformers' config.json, for the families in scope.

Family differences that live in the config rather than in code (transformers 5.x modeling files):
    llama    attention_bias puts a bias on q, k, v *and* o; mlp_bias on all three MLP matrices
    mistral  as llama without biases, plus sliding_window
    qwen2    bias on q, k, v only (hard-coded in Qwen2Attention), none on o
    gemma    GeGLU with tanh GELU, RMSNorm scale (1 + w), embeddings times sqrt(d_model), tied
RoPE settings are read from v5 `rope_parameters` or v4 `rope_theta` + `rope_scaling`, and
written back in the v5 form.

This module sits beneath `llamablock.config`: it turns a config.json into the keyword arguments
of `ModelConfig` (and any object with ModelConfig's fields back into a config.json), and never
imports the dataclass, so `ModelConfig.from_hf` / `to_hf` can call it without an import cycle.
"""

from __future__ import annotations

import math
from typing import Any

from llamablock.rope_scaling import ntk_base

SUPPORTED = ("llama", "mistral", "qwen2", "gemma")
_GATED_ACTS = {"silu": "swiglu", "swish": "swiglu", "gelu_pytorch_tanh": "geglu", "gelu_new": "geglu"}


def rope_settings(hf: dict[str, Any]) -> tuple[float, dict | None, float]:
    """(theta, scaling dict or None, partial rotary factor) from either transformers form.

    When a config.json holds both, transformers 5 takes a non-empty v4 `rope_scaling` and
    ignores `rope_parameters` entirely (its rope_theta included), so we do the same;
    `llamablock rope lint` warns when the two disagree.
    """
    params = hf.get("rope_parameters")
    legacy = hf.get("rope_scaling")
    for key, value in (("rope_parameters", params), ("rope_scaling", legacy)):
        if value is not None and not isinstance(value, dict):
            raise ValueError(f"config.json {key} must be a JSON object or null, got {value!r}")
    if isinstance(legacy, dict) and legacy:
        scaling = dict(legacy)
    elif isinstance(params, dict) and params:
        scaling = dict(params)
    else:
        scaling = {}
    theta = scaling.pop("rope_theta", hf.get("rope_theta", 10000.0))
    partial = scaling.pop("partial_rotary_factor", hf.get("partial_rotary_factor", 1.0))
    if "type" in scaling and "rope_type" not in scaling:  # v4 before 4.45 said "type"
        scaling["rope_type"] = scaling.pop("type")
    else:
        scaling.pop("type", None)
    if scaling.get("rope_type", "default") == "default":
        scaling = None
    elif scaling["rope_type"] in ("llama3", "yarn", "longrope") and hf.get("original_max_position_embeddings"):
        # A top-level original length (Phi-3 writes it there) wins over the dict's: transformers'
        # rotary embedding re-runs standardize_rope_params, which gives it priority.
        scaling["original_max_position_embeddings"] = hf["original_max_position_embeddings"]
    for key, value in (("rope_theta", theta), ("partial_rotary_factor", partial)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise ValueError(f"config.json {key} must be a finite number, got {value!r}")
    return float(theta), scaling, float(partial)


_REQUIRED = object()


def _typed(hf: dict[str, Any], key: str, kind: type, default: Any = _REQUIRED) -> Any:
    """hf[key] checked to be of `kind` (a JSON string where a number or a flag belongs is an
    error naming the field, never converted); `default` when the key is absent or null."""
    value = hf.get(key)
    if value is None:
        if default is _REQUIRED:
            raise ValueError(f"config.json lacks {key!r}, which the model's shape needs")
        return default
    if kind is bool and not isinstance(value, bool):
        raise ValueError(f"config.json {key} must be true or false, got {value!r}")
    if kind is int and (isinstance(value, bool) or not isinstance(value, int)):
        raise ValueError(f"config.json {key} must be an integer, got {value!r}")
    if kind is float and (isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value)):
        raise ValueError(f"config.json {key} must be a finite number, got {value!r}")
    return value


def fields_from_hf(hf: dict[str, Any]) -> dict[str, Any]:
    """ModelConfig's keyword arguments for a transformers config.json of a supported family; each
    field's type is checked here, the values' ranges by ModelConfig.validate."""
    if not isinstance(hf, dict):
        raise ValueError(f"a config.json must hold a JSON object, got {type(hf).__name__}")
    family = hf.get("model_type")
    if family not in SUPPORTED:
        raise ValueError(
            f"model_type {family!r} is not supported; llamablock implements {list(SUPPORTED)}. "
            "A different architecture would load but compute something else, so it is refused."
        )
    act = hf.get("hidden_activation") or hf.get("hidden_act") or "silu"
    if not isinstance(act, str) or act not in _GATED_ACTS:
        raise ValueError(f"hidden_act {act!r} is not supported for {family}; expected one of {sorted(_GATED_ACTS)}")
    if family == "qwen2" and hf.get("use_sliding_window"):
        raise ValueError("qwen2 with use_sliding_window=true (window on some layers only) is not supported")
    theta, scaling, partial = rope_settings(hf)
    n_heads, d_model = _typed(hf, "num_attention_heads", int), _typed(hf, "hidden_size", int)
    if n_heads <= 0:
        raise ValueError(f"config.json num_attention_heads must be positive, got {n_heads}")
    attention_bias = _typed(hf, "attention_bias", bool, False)
    known = dict(
        vocab_size=_typed(hf, "vocab_size", int),
        d_model=d_model,
        n_layers=_typed(hf, "num_hidden_layers", int),
        n_heads=n_heads,
        n_kv_heads=_typed(hf, "num_key_value_heads", int, n_heads),
        head_dim=_typed(hf, "head_dim", int, d_model // n_heads),
        d_ff=_typed(hf, "intermediate_size", int),
        norm="rmsnorm",
        norm_placement="pre",
        norm_eps=_typed(hf, "rms_norm_eps", float, 1e-6),
        norm_offset=1.0 if family == "gemma" else 0.0,
        ffn=_GATED_ACTS[act],
        position="rope",
        max_seq_len=_typed(hf, "max_position_embeddings", int, 2048),
        rope_theta=theta,
        rope_layout="half",  # transformers checkpoints store q/k rows for rotate_half
        partial_rotary_factor=partial,
        rope_scaling=scaling,
        qkv_bias=family == "qwen2" or attention_bias,
        o_bias=attention_bias if family == "llama" else False,
        mlp_bias=_typed(hf, "mlp_bias", bool, False) if family == "llama" else False,
        tie_embeddings=_typed(hf, "tie_word_embeddings", bool, family == "gemma"),
        embed_scale=math.sqrt(max(d_model, 0)) if family == "gemma" else None,
        sliding_window=_typed(hf, "sliding_window", int, None) if family == "mistral" else None,
        family=family,
    )
    extra = {k: hf[k] for k in ("bos_token_id", "eos_token_id", "pad_token_id", "hidden_act") if k in hf}
    return {**known, "extra": extra}


def config_to_hf(cfg) -> dict[str, Any]:
    """The config.json of `cfg` (a ModelConfig), in transformers 5's form."""
    if cfg.family not in SUPPORTED:
        raise ValueError(
            f"family {cfg.family!r} has no transformers equivalent; only {list(SUPPORTED)} export to config.json"
        )
    if cfg.rope_layout != "half":
        raise ValueError("transformers expects rope_layout='half'; convert with llamablock.rope.permute_qk first")
    rope = {"rope_theta": cfg.rope_theta, "rope_type": "default"}
    if cfg.rope_scaling and cfg.rope_scaling.get("rope_type") == "ntk":
        # transformers has no static NTK type; the same frequencies are default RoPE at the raised base.
        rope["rope_theta"] = ntk_base(cfg.rope_theta, cfg.rope_scaling["factor"], cfg.rotary_dim)
    elif cfg.rope_scaling:
        rope.update(cfg.rope_scaling)
    if cfg.partial_rotary_factor != 1.0:
        rope["partial_rotary_factor"] = cfg.partial_rotary_factor
    act = {"swiglu": "silu", "geglu": "gelu_pytorch_tanh"}[cfg.ffn]
    hf = {
        "model_type": cfg.family,
        "architectures": [{"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM",
                           "qwen2": "Qwen2ForCausalLM", "gemma": "GemmaForCausalLM"}[cfg.family]],
        "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.d_model,
        "num_hidden_layers": cfg.n_layers,
        "num_attention_heads": cfg.n_heads,
        "num_key_value_heads": cfg.n_kv_heads,
        "head_dim": cfg.head_dim,
        "intermediate_size": cfg.d_ff,
        "rms_norm_eps": cfg.norm_eps,
        "hidden_act": act,
        "max_position_embeddings": cfg.max_seq_len,
        "rope_parameters": rope,
        "tie_word_embeddings": cfg.tie_embeddings,
    }
    if cfg.family == "llama":
        hf["attention_bias"] = cfg.qkv_bias
        hf["mlp_bias"] = cfg.mlp_bias
    if cfg.family == "mistral":
        hf["sliding_window"] = cfg.sliding_window
    if cfg.family == "gemma":
        hf["hidden_activation"] = act
    for k, v in cfg.extra.items():
        hf.setdefault(k, v)
    return hf

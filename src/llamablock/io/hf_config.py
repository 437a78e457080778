"""Translate between `ModelConfig` and transformers' config.json, for the families in scope.

Family differences that live in the config rather than in code (transformers 5.x modeling files):
    llama    attention_bias puts a bias on q, k, v *and* o; mlp_bias on all three MLP matrices
    mistral  as llama without biases, plus sliding_window
    qwen2    bias on q, k, v only (hard-coded in Qwen2Attention), none on o
    gemma    GeGLU with tanh GELU, RMSNorm scale (1 + w), embeddings times sqrt(d_model), tied
and the descendants (README "Families"):
    qwen3        qwen2's block with q/k norms; attention_bias on q, k, v and o; in both, sliding
                 layers from max_window_layers on when use_sliding_window
    gemma2       gemma plus sandwich norms, soft-capped scores and logits, query_pre_attn_scalar,
                 sliding and full layers alternating (layer_types)
    gemma3_text  gemma2 without the capping, plus q/k norms and a RoPE per layer kind (v5
                 rope_parameters keyed by layer type; v4 rope_local_base_freq): five local layers to one
    phi3         llama's block with fused qkv_proj and gate_up_proj weights (split on load,
                 io/hf_checkpoint.py), LongRoPE, a window on every layer when sliding_window is set
Defaults for absent keys are transformers' own per family (a Qwen3 head is 128 wide whatever
hidden_size says; Gemma 2 caps unless the key is null).
RoPE settings are read from v5 `rope_parameters` or v4 `rope_theta` + `rope_scaling`, and
written back in the v5 form.

`config_from_hf` turns a config.json's object into a `ModelConfig`, `config_to_hf` a config
back into one, and `config_from_file` reads either a transformers config.json or one of ours.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from llamablock.config import ModelConfig
from llamablock.io.resolve import read_json
from llamablock.rope_scaling import ntk_base
from llamablock.util.reads import MAX_JSON, regular_file

SUPPORTED = ("llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2", "gemma3_text", "phi3")
_GEMMAS = ("gemma", "gemma2", "gemma3_text")
_HEAD_DIM = {"qwen3": 128, "gemma2": 256, "gemma3_text": 256}  # transformers' defaults when absent
_CAPS = {"gemma2": (50.0, 30.0)}  # (attn_logit_softcapping, final_logit_softcapping) when absent
_KINDS = {"full_attention": "full", "sliding_attention": "sliding"}
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


def _optional(hf: dict[str, Any], key: str, default: float | None) -> float | None:
    """A number that may be switched off: null in the file is None, an absent key `default`."""
    if key in hf and hf[key] is None:
        return None
    return _typed(hf, key, float, default)


def _gemma3_rope(hf: dict[str, Any]) -> tuple[dict[str, Any], float | None]:
    """Gemma 3's two RoPEs: a view of `hf` holding the full layers' settings, and the local layers' base
    (None when the sliding layers share the full layers' scaled RoPE, as config_to_hf writes a model
    whose local_rope_theta is None)."""
    params = hf.get("rope_parameters")
    if isinstance(params, dict) and {"full_attention", "sliding_attention"} & set(params):
        full, local = params.get("full_attention") or {}, params.get("sliding_attention") or {}
        if not isinstance(full, dict) or not isinstance(local, dict):
            raise ValueError("config.json rope_parameters must map full_attention and sliding_attention to objects")
        view = {**hf, "rope_parameters": {"rope_theta": 1_000_000.0, **full}, "rope_scaling": None}
        if local.get("rope_type", "default") != "default":
            if local == full:  # one scaled RoPE for every layer; transformers computes each type's alike
                return view, None
            raise ValueError(f"gemma3 sliding layers with rope_type {local['rope_type']!r} are not supported "
                             "(Gemma 3 scales only its global layers)")
        return view, _typed(local, "rope_theta", float, 10_000.0)
    view = {**hf, "rope_theta": hf.get("rope_theta", 1_000_000.0)}  # v4 form; transformers' defaults
    return view, _typed(hf, "rope_local_base_freq", float, 10_000.0)


def _layer_types(hf: dict[str, Any], family: str, n_layers: int) -> list[str] | None:
    """"full"/"sliding" per layer from `layer_types`, else the family's rule as transformers derives it."""
    raw = hf.get("layer_types")
    if raw is not None:
        if not isinstance(raw, list) or len(raw) != n_layers or any(k not in _KINDS for k in raw):
            raise ValueError(f"config.json layer_types must list {sorted(_KINDS)} once per layer "
                             f"({n_layers}), got {str(raw)[:80]}")
        return [_KINDS[k] for k in raw]
    if family == "gemma2":
        return ["sliding" if (i + 1) % 2 else "full" for i in range(n_layers)]
    if family == "gemma3_text":
        every = _typed(hf, "sliding_window_pattern", int, 6)
        if every <= 0:  # transformers divides by it (0: ZeroDivisionError) to place the global layers
            raise ValueError(f"config.json sliding_window_pattern must be a positive integer (one global layer "
                             f"every so many), got {every}")
        return ["sliding" if (i + 1) % every else "full" for i in range(n_layers)]
    if family in ("qwen2", "qwen3"):
        first = _typed(hf, "max_window_layers", int, 28)
        return ["sliding" if i >= first else "full" for i in range(n_layers)]
    return None


def _descendant_fields(hf: dict[str, Any], family: str, n_layers: int) -> dict[str, Any]:
    """The fields of the block's descendants (config.py): windows by layer, norms, caps, scale."""
    if family in ("mistral", "phi3"):
        window = _typed(hf, "sliding_window", int, None)
    elif family in ("qwen2", "qwen3") and not _typed(hf, "use_sliding_window", bool, False):
        window = None
    elif family in ("gemma2", "gemma3_text", "qwen2", "qwen3"):
        # absent: transformers' default 4096; null: no window at all (its attention then passes None)
        window = None if "sliding_window" in hf and hf["sliding_window"] is None else _typed(hf, "sliding_window", int, 4096)
    else:
        window = None
    # checked even where no window uses them: transformers validates these families' layer_types too
    kinds = _layer_types(hf, family, n_layers) if family in ("gemma2", "gemma3_text", "qwen2", "qwen3") else None
    kinds = kinds if window is not None else None
    if kinds is not None and "sliding" not in kinds:
        window, kinds = None, None  # no layer uses the window
    elif kinds is not None and "full" not in kinds:
        kinds = None  # every layer windowed: the default for a config with sliding_window
    attn_cap, final_cap = (_optional(hf, "attn_logit_softcapping", _CAPS[family][0]),
                           _optional(hf, "final_logit_softcapping", _CAPS[family][1])) if family in _CAPS else (None, None)
    if family == "gemma3_text":  # transformers' Gemma 3 caps the logits when asked, never the scores
        final_cap = _optional(hf, "final_logit_softcapping", None)
    sandwich = family in ("gemma2", "gemma3_text")
    return dict(
        sliding_window=window, layer_types=kinds, qk_norm=family in ("qwen3", "gemma3_text"),
        sandwich_norm=sandwich, attn_softcap=attn_cap, final_softcap=final_cap,
        query_pre_attn_scalar=_typed(hf, "query_pre_attn_scalar", float, 256) if sandwich else None,
    )


def fields_from_hf(hf: dict[str, Any]) -> dict[str, Any]:
    """ModelConfig's keyword arguments for a transformers config.json of a supported family; each
    field's type is checked here, the values' ranges by ModelConfig.validate."""
    if not isinstance(hf, dict):
        raise ValueError(f"a config.json must hold a JSON object, got {type(hf).__name__}")
    family = hf.get("model_type")
    if family == "gemma3" and isinstance(hf.get("text_config"), dict):
        # A multimodal Gemma 3 checkpoint: its language model (the vision tower is not loaded).
        # Gemma3ForConditionalGeneration ties its head by the outer config's flag (default true).
        tied = hf.get("tie_word_embeddings", hf["text_config"].get("tie_word_embeddings", True))
        family, hf = "gemma3_text", {**hf["text_config"], "model_type": "gemma3_text", "tie_word_embeddings": tied}
    if family not in SUPPORTED:
        raise ValueError(
            f"model_type {family!r} is not supported; llamablock implements {list(SUPPORTED)}. "
            "A different architecture would load but compute something else, so it is refused."
        )
    act = hf.get("hidden_activation") or hf.get("hidden_act") or "silu"
    if not isinstance(act, str) or act not in _GATED_ACTS:
        raise ValueError(f"hidden_act {act!r} is not supported for {family}; expected one of {sorted(_GATED_ACTS)}")
    local_theta = None
    if family == "gemma3_text":
        hf, local_theta = _gemma3_rope(hf)
    theta, scaling, partial = rope_settings(hf)
    n_heads, d_model = _typed(hf, "num_attention_heads", int), _typed(hf, "hidden_size", int)
    if n_heads <= 0:
        raise ValueError(f"config.json num_attention_heads must be positive, got {n_heads}")
    n_layers = _typed(hf, "num_hidden_layers", int)
    attention_bias = _typed(hf, "attention_bias", bool, False)
    gemma = family in _GEMMAS
    known = dict(
        vocab_size=_typed(hf, "vocab_size", int),
        d_model=d_model,
        n_layers=n_layers,
        n_heads=n_heads,
        n_kv_heads=_typed(hf, "num_key_value_heads", int, n_heads),
        head_dim=_typed(hf, "head_dim", int, _HEAD_DIM.get(family, d_model // n_heads)),
        d_ff=_typed(hf, "intermediate_size", int),
        norm="rmsnorm",
        norm_placement="pre",
        norm_eps=_typed(hf, "rms_norm_eps", float, 1e-5 if family == "phi3" else 1e-6),
        norm_offset=1.0 if gemma else 0.0,
        ffn=_GATED_ACTS[act],
        position="rope",
        max_seq_len=_typed(hf, "max_position_embeddings", int, 2048),
        rope_theta=theta,
        rope_layout="half",  # transformers checkpoints store q/k rows for rotate_half
        partial_rotary_factor=1.0 if family == "gemma3_text" else partial,  # Gemma 3 rotates whole heads
        rope_scaling=scaling,
        qkv_bias=family == "qwen2" or attention_bias,
        o_bias=attention_bias if family in ("llama", "qwen3", "gemma2", "gemma3_text") else False,
        mlp_bias=_typed(hf, "mlp_bias", bool, False) if family == "llama" else False,
        tie_embeddings=_typed(hf, "tie_word_embeddings", bool, gemma),
        embed_scale=math.sqrt(max(d_model, 0)) if gemma else None,
        local_rope_theta=local_theta,
        family=family,
        **_descendant_fields(hf, family, n_layers),
    )
    extra = {k: hf[k] for k in ("bos_token_id", "eos_token_id", "pad_token_id", "hidden_act") if k in hf}
    return {**known, "extra": extra}


_ARCHITECTURES = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM", "qwen2": "Qwen2ForCausalLM",
                  "qwen3": "Qwen3ForCausalLM", "gemma": "GemmaForCausalLM", "gemma2": "Gemma2ForCausalLM",
                  "gemma3_text": "Gemma3ForCausalLM", "phi3": "Phi3ForCausalLM"}


def _descendants_to_hf(cfg, rope: dict[str, Any]) -> dict[str, Any]:
    """The descendants' keys of config.json (the inverse of _descendant_fields)."""
    family, out = cfg.family, {}
    named = {"full": "full_attention", "sliding": "sliding_attention"}
    if family in ("qwen2", "qwen3", "gemma2", "gemma3_text"):
        out["layer_types"] = [named[k] for k in cfg.layer_kinds]
        out["sliding_window"] = cfg.sliding_window
    if family in ("qwen3", "gemma2", "gemma3_text"):
        out["attention_bias"] = cfg.qkv_bias
    if family in ("qwen2", "qwen3"):
        out["use_sliding_window"] = cfg.sliding_window is not None
        out["max_window_layers"] = cfg.layer_kinds.index("sliding") if "sliding" in cfg.layer_kinds else cfg.n_layers
    if family in ("gemma2", "gemma3_text"):
        out["query_pre_attn_scalar"] = cfg.query_pre_attn_scalar
        out["final_logit_softcapping"] = cfg.final_softcap
        out["attn_logit_softcapping"] = cfg.attn_softcap
    if family == "phi3" and cfg.rope_scaling and "original_max_position_embeddings" in cfg.rope_scaling:
        # Phi3Config keeps its own top-level original length (default 4096), which wins over the dict's.
        out["original_max_position_embeddings"] = cfg.rope_scaling["original_max_position_embeddings"]
    if family == "gemma3_text":
        # local_rope_theta None: the sliding layers rotate with the full layers' RoPE, scaling included
        local = (dict(rope) if cfg.local_rope_theta is None and cfg.rope_scaling
                 else {"rope_type": "default", "rope_theta": cfg.local_rope_theta or cfg.rope_theta})
        out["rope_parameters"] = {"full_attention": rope, "sliding_attention": local}
    return out


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
        "architectures": [_ARCHITECTURES[cfg.family]],
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
    if cfg.family in ("mistral", "phi3"):
        hf["sliding_window"] = cfg.sliding_window
    if cfg.family in _GEMMAS:
        hf["hidden_activation"] = act
    hf.update(_descendants_to_hf(cfg, rope))
    for k, v in cfg.extra.items():
        hf.setdefault(k, v)
    return hf


def config_from_hf(hf: dict[str, Any], source: str | Path | None = None) -> ModelConfig:
    """The ModelConfig of a transformers config.json's object; `source` (its path) names the file in errors."""
    try:
        return ModelConfig(**fields_from_hf(hf))
    except ValueError as e:
        if source is None:
            raise
        msg = str(e)
        raise ValueError(f"{source} {msg[len('config.json '):]}" if msg.startswith("config.json ")
                         else f"{source}: {msg}") from None


def config_from_file(path: str | Path) -> ModelConfig:
    """A transformers config.json, or one of ours (written by `save_pretrained` or training). A FIFO,
    a device or a huge file is refused by name before it is read (util/reads.py)."""
    d = read_json(regular_file(path, "config file", MAX_JSON))
    if "model_type" in d:
        return config_from_hf(d, path)
    try:
        return ModelConfig.from_dict(d)
    except ValueError as e:
        raise ValueError(f"{path}: {e}") from None

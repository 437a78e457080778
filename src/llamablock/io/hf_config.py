"""Translate between `ModelConfig` and transformers' config.json, for the families in scope.

Each family's names and defaults are its record in families.py (transformers' own defaults per
family: a Qwen3 head is 128 wide whatever hidden_size says; Gemma 2 caps unless the key is null);
this module only reads and writes the keys. What the keys mean (transformers 5.x modeling files):
attention_bias biases q, k, v, and o too where the record says so (Qwen2 biases q, k, v whatever
it says); mlp_bias the three MLP matrices; hidden_act / hidden_activation choose SwiGLU or GeGLU;
sliding_window reaches every layer, the upper ones (from max_window_layers on, when
use_sliding_window), or the local ones of a local/global pattern (layer_types, or one global in
every sliding_window_pattern); Gemma 3 keeps a RoPE per layer kind (v5 rope_parameters keyed by
layer type; v4 rope_local_base_freq); Phi-3's fused weights are split on load (io/hf_checkpoint.py).
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
from llamablock.families import HF_TYPES, Family
from llamablock.io.resolve import read_json
from llamablock.rope_scaling import ntk_base
from llamablock.util.reads import MAX_JSON, regular_file

SUPPORTED = tuple(HF_TYPES)  # the model_types read
_MULTIMODAL = {f.multimodal: f for f in HF_TYPES.values() if f.multimodal}  # outer model_type -> text family
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


def _two_ropes(hf: dict[str, Any], fam: Family) -> tuple[dict[str, Any], float | None]:
    """A family with a RoPE per layer kind (Gemma 3): a view of `hf` holding the full layers' settings,
    and the local layers' base (None when the sliding layers share the full layers' scaled RoPE, as
    config_to_hf writes a model whose local_rope_theta is None)."""
    params = hf.get("rope_parameters")
    if isinstance(params, dict) and {"full_attention", "sliding_attention"} & set(params):
        full, local = params.get("full_attention") or {}, params.get("sliding_attention") or {}
        if not isinstance(full, dict) or not isinstance(local, dict):
            raise ValueError("config.json rope_parameters must map full_attention and sliding_attention to objects")
        view = {**hf, "rope_parameters": {"rope_theta": fam.rope_theta, **full}, "rope_scaling": None}
        if local.get("rope_type", "default") != "default":
            if local == full:  # one scaled RoPE for every layer; transformers computes each type's alike
                return view, None
            raise ValueError(f"{fam.name} sliding layers with rope_type {local['rope_type']!r} are not supported "
                             "(the family scales only its global layers)")
        return view, _typed(local, "rope_theta", float, fam.local_rope_theta)
    view = {**hf, "rope_theta": hf.get("rope_theta", fam.rope_theta)}  # v4 form; transformers' defaults
    return view, _typed(hf, "rope_local_base_freq", float, fam.local_rope_theta)


def _layer_types(hf: dict[str, Any], fam: Family, n_layers: int) -> list[str] | None:
    """"full"/"sliding" per layer from `layer_types`, else the family's rule as transformers derives it."""
    raw = hf.get("layer_types")
    if raw is not None:
        if not isinstance(raw, list) or len(raw) != n_layers or any(k not in _KINDS for k in raw):
            raise ValueError(f"config.json layer_types must list {sorted(_KINDS)} once per layer "
                             f"({n_layers}), got {str(raw)[:80]}")
        return [_KINDS[k] for k in raw]
    if fam.window == "local":
        every = _typed(hf, fam.global_every_key, int, fam.global_every) if fam.global_every_key else fam.global_every
        if every <= 0:  # transformers divides by it (0: ZeroDivisionError) to place the global layers
            raise ValueError(f"config.json {fam.global_every_key} must be a positive integer (one global layer "
                             f"every so many), got {every}")
        return fam.layer_pattern(n_layers, every)
    first = _typed(hf, "max_window_layers", int, fam.window_from)  # "upper"
    return ["sliding" if i >= first else "full" for i in range(n_layers)]


def _window(hf: dict[str, Any], fam: Family) -> int | None:
    """The sliding window config.json gives the family's layers, or None."""
    if fam.window == "all":
        return _typed(hf, "sliding_window", int, None)
    if fam.window is None or fam.window == "upper" and not _typed(hf, "use_sliding_window", bool, False):
        return None
    # absent: the family's default; null: no window at all (transformers' attention then passes None)
    return None if "sliding_window" in hf and hf["sliding_window"] is None else _typed(
        hf, "sliding_window", int, fam.sliding_window)


def _descendant_fields(hf: dict[str, Any], fam: Family, n_layers: int) -> dict[str, Any]:
    """The fields of the block's descendants (config.py): windows by layer, norms, caps, scale."""
    window = _window(hf, fam)
    # checked even where no window uses them: transformers validates these families' layer_types too
    kinds = _layer_types(hf, fam, n_layers) if fam.window in ("upper", "local") else None
    kinds = kinds if window is not None else None
    if kinds is not None and "sliding" not in kinds:
        window, kinds = None, None  # no layer uses the window
    elif kinds is not None and "full" not in kinds:
        kinds = None  # every layer windowed: the default for a config with sliding_window
    caps = {key: _optional(hf, key, default) for key, default in fam.softcaps.items()}
    scalar = fam.query_pre_attn_scalar
    return dict(
        sliding_window=window, layer_types=kinds, qk_norm=fam.qk_norm, sandwich_norm=fam.sandwich,
        attn_softcap=caps.get("attn_logit_softcapping"), final_softcap=caps.get("final_logit_softcapping"),
        query_pre_attn_scalar=None if scalar is None else _typed(hf, "query_pre_attn_scalar", float, scalar),
    )


def fields_from_hf(hf: dict[str, Any]) -> dict[str, Any]:
    """ModelConfig's keyword arguments for a transformers config.json of a supported family; each
    field's type is checked here, the values' ranges by ModelConfig.validate."""
    if not isinstance(hf, dict):
        raise ValueError(f"a config.json must hold a JSON object, got {type(hf).__name__}")
    family = hf.get("model_type")
    if isinstance(family, str) and family in _MULTIMODAL and isinstance(hf.get("text_config"), dict):
        # A multimodal checkpoint (Gemma 3's): its language model (the vision tower is not loaded).
        # Gemma3ForConditionalGeneration ties its head by the outer config's flag (default true).
        text = _MULTIMODAL[family].name
        tied = hf.get("tie_word_embeddings", hf["text_config"].get("tie_word_embeddings", True))
        family, hf = text, {**hf["text_config"], "model_type": text, "tie_word_embeddings": tied}
    fam = HF_TYPES.get(family) if isinstance(family, str) else None  # a list or an object names no family
    if fam is None:
        raise ValueError(
            f"model_type {family!r} is not supported; llamablock implements {list(SUPPORTED)}. "
            "A different architecture would load but compute something else, so it is refused."
        )
    act = hf.get("hidden_activation") or hf.get("hidden_act") or "silu"
    if not isinstance(act, str) or act not in _GATED_ACTS:
        raise ValueError(f"hidden_act {act!r} is not supported for {family}; expected one of {sorted(_GATED_ACTS)}")
    local_theta = None
    if fam.local_rope_theta is not None:
        hf, local_theta = _two_ropes(hf, fam)
    theta, scaling, partial = rope_settings(hf)
    n_heads, d_model = _typed(hf, "num_attention_heads", int), _typed(hf, "hidden_size", int)
    if n_heads <= 0:
        raise ValueError(f"config.json num_attention_heads must be positive, got {n_heads}")
    n_layers = _typed(hf, "num_hidden_layers", int)
    attention_bias = _typed(hf, "attention_bias", bool, False)
    known = dict(
        fam.fields(max(d_model, 0), n_layers),
        vocab_size=_typed(hf, "vocab_size", int),
        d_model=d_model,
        n_layers=n_layers,
        n_heads=n_heads,
        n_kv_heads=_typed(hf, "num_key_value_heads", int, n_heads),
        head_dim=_typed(hf, "head_dim", int, fam.head_dim or d_model // n_heads),
        d_ff=_typed(hf, "intermediate_size", int),
        norm="rmsnorm",
        norm_placement="pre",
        norm_eps=_typed(hf, "rms_norm_eps", float, fam.norm_eps),
        ffn=_GATED_ACTS[act],
        position="rope",
        max_seq_len=_typed(hf, "max_position_embeddings", int, 2048),
        rope_theta=theta,
        rope_layout="half",  # transformers checkpoints store q/k rows for rotate_half
        partial_rotary_factor=1.0 if fam.local_rope_theta is not None else partial,  # Gemma 3: whole heads
        rope_scaling=scaling,
        qkv_bias=fam.qkv_bias or attention_bias,
        o_bias=attention_bias and fam.o_bias,
        mlp_bias=_typed(hf, "mlp_bias", bool, False) if fam.mlp_bias else False,
        tie_embeddings=_typed(hf, "tie_word_embeddings", bool, fam.tied),
        local_rope_theta=local_theta,
        **_descendant_fields(hf, fam, n_layers),
    )
    extra = {k: hf[k] for k in ("bos_token_id", "eos_token_id", "pad_token_id", "hidden_act") if k in hf}
    return {**known, "extra": extra}


def _descendants_to_hf(cfg, fam: Family, rope: dict[str, Any]) -> dict[str, Any]:
    """The descendants' keys of config.json (the inverse of _descendant_fields)."""
    out = {}
    named = {"full": "full_attention", "sliding": "sliding_attention"}
    if fam.window in ("upper", "local"):
        out["layer_types"] = [named[k] for k in cfg.layer_kinds]
        out["sliding_window"] = cfg.sliding_window
    if fam.window == "upper":
        out["use_sliding_window"] = cfg.sliding_window is not None
        out["max_window_layers"] = cfg.layer_kinds.index("sliding") if "sliding" in cfg.layer_kinds else cfg.n_layers
    if fam.query_pre_attn_scalar is not None:
        out["query_pre_attn_scalar"] = cfg.query_pre_attn_scalar
    if fam.softcaps:
        out["final_logit_softcapping"] = cfg.final_softcap
        out["attn_logit_softcapping"] = cfg.attn_softcap
    if fam.original_top_level and cfg.rope_scaling and "original_max_position_embeddings" in cfg.rope_scaling:
        # Phi3Config keeps its own top-level original length (default 4096), which wins over the dict's.
        out["original_max_position_embeddings"] = cfg.rope_scaling["original_max_position_embeddings"]
    if fam.local_rope_theta is not None:
        # local_rope_theta None: the sliding layers rotate with the full layers' RoPE, scaling included
        local = (dict(rope) if cfg.local_rope_theta is None and cfg.rope_scaling
                 else {"rope_type": "default", "rope_theta": cfg.local_rope_theta or cfg.rope_theta})
        out["rope_parameters"] = {"full_attention": rope, "sliding_attention": local}
    return out


def config_to_hf(cfg) -> dict[str, Any]:
    """The config.json of `cfg` (a ModelConfig), in transformers 5's form."""
    if cfg.family not in HF_TYPES:
        raise ValueError(
            f"family {cfg.family!r} has no transformers equivalent; only {list(SUPPORTED)} export to config.json"
        )
    fam = HF_TYPES[cfg.family]
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
        "architectures": [fam.architecture],
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
    if fam.o_bias:
        hf["attention_bias"] = cfg.qkv_bias
    if fam.mlp_bias:
        hf["mlp_bias"] = cfg.mlp_bias
    if fam.window == "all":
        hf["sliding_window"] = cfg.sliding_window
    if fam.ffn == "geglu":  # Gemma's config names its activation hidden_activation
        hf["hidden_activation"] = act
    hf.update(_descendants_to_hf(cfg, fam, rope))
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

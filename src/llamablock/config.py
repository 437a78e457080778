"""Model configuration: one dataclass for every model in scope, 2017 to 2024.

Every choice the module discusses is a field, kept as a plain string or number so the
config serializes to JSON (the convention of litgpt's `Config` and gpt-fast's `ModelArgs`):

    position      "rope" | "alibi" | "learned" | "sinusoidal" | "none"     (15.1, 15.2)
    norm          "rmsnorm" | "layernorm", placed "pre" or "post"          (15.3, 8.5)
    ffn           "swiglu" | "geglu" | "relu" | "gelu"                      (15.4)
    n_kv_heads    == n_heads is MHA, 1 is MQA, between is GQA             (15.5)

and the block's descendants (beyond the module; README "Families"), each a field off by default,
described where it is declared; each family's record (families.py) says which it sets.

Invalid values raise ValueError naming the field. transformers' config.json is translated
by io/hf_config.py (`config_from_hf`, `config_to_hf`).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

from llamablock.families import FAMILIES
from llamablock.ffn import default_ffn_width
from llamablock.rope_scaling import validate_rope_scaling

POSITIONS = ("rope", "alibi", "learned", "sinusoidal", "none")
NORMS = ("rmsnorm", "layernorm")
PLACEMENTS = ("pre", "post")
FFNS = ("swiglu", "geglu", "relu", "gelu")
ROPE_LAYOUTS = ("half", "interleaved")
LAYER_TYPES = ("full", "sliding")


@dataclass
class ModelConfig:
    # Shape: sizes of the embedding, the stack, the heads and the context.
    vocab_size: int
    d_model: int
    n_layers: int
    n_heads: int
    n_kv_heads: int | None = None  # None: as many as n_heads (MHA)
    head_dim: int | None = None  # None: d_model // n_heads
    d_ff: int | None = None  # None: 4 d for relu/gelu, 8/3 d rounded to 256 for gated
    max_seq_len: int = 2048

    # The module's choices, 2017 to 2024 (15.1-15.5).
    norm: str = "rmsnorm"
    norm_placement: str = "pre"
    norm_eps: float = 1e-5
    ffn: str = "swiglu"
    position: str = "rope"
    rope_theta: float = 10000.0
    rope_layout: str = "half"  # "half": rotate_half as transformers; "interleaved": Meta, the module
    partial_rotary_factor: float = 1.0
    rope_scaling: dict[str, Any] | None = None  # transformers' dict; None = default RoPE
    qkv_bias: bool = False
    o_bias: bool = False
    mlp_bias: bool = False
    tie_embeddings: bool = False

    # The descendants (families.py names who uses each); off by default.
    norm_offset: float = 0.0  # RMSNorm scales stored as w with output x/rms * (offset + w) (Gemma: 1)
    embed_scale: float | None = None  # embeddings times this (Gemma: sqrt(d_model))
    sliding_window: int | None = None  # a "sliding" layer attends to its last sliding_window tokens
    layer_types: list[str] | None = None  # None: every layer "sliding" if sliding_window is set, else "full"
    local_rope_theta: float | None = None  # sliding layers' own RoPE base, unscaled; None: the full layers' RoPE
    qk_norm: bool = False  # RMSNorm over each head's queries and keys before RoPE
    sandwich_norm: bool = False  # a norm after each sub-layer as well as before it
    attn_softcap: float | None = None  # scores through c tanh(x / c)
    final_softcap: float | None = None  # logits through c tanh(x / c)
    query_pre_attn_scalar: float | None = None  # scores scaled by its -1/2 power; None: head_dim's

    # Where it came from: the family whose file formats it speaks, and config.json keys kept for round trips.
    family: str = "llamablock"
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self):
        if self.n_kv_heads is None:
            self.n_kv_heads = self.n_heads
        if self.head_dim is None and self.n_heads > 0:
            self.head_dim = self.d_model // self.n_heads
        if self.d_ff is None and self.d_model > 0:
            self.d_ff = default_ffn_width(self.d_model, self.ffn)
        self.validate()

    def validate(self) -> None:
        for name in ("vocab_size", "d_model", "n_layers", "n_heads", "n_kv_heads", "head_dim", "d_ff", "max_seq_len"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if self.n_heads % self.n_kv_heads:
            raise ValueError(f"n_heads ({self.n_heads}) must be divisible by n_kv_heads ({self.n_kv_heads}): "
                             "each key-value head serves a whole group of query heads")
        for name, allowed in (("position", POSITIONS), ("norm", NORMS), ("norm_placement", PLACEMENTS),
                              ("ffn", FFNS), ("rope_layout", ROPE_LAYOUTS), ("family", tuple(FAMILIES))):
            if getattr(self, name) not in allowed:
                raise ValueError(f"{name} must be one of {allowed}, got {getattr(self, name)!r}")
        for name in ("qkv_bias", "o_bias", "mlp_bias", "tie_embeddings", "qk_norm", "sandwich_norm"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be true or false, got {getattr(self, name)!r}")
        for name in ("norm_eps", "rope_theta", "norm_offset", "partial_rotary_factor"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise ValueError(f"{name} must be a finite number, got {value!r}")
        if self.rope_scaling is not None and not isinstance(self.rope_scaling, dict):
            raise ValueError(f"rope_scaling must be a dict (transformers' form) or None, got {self.rope_scaling!r}")
        if not self.norm_eps > 0:
            raise ValueError(f"norm_eps must be positive, got {self.norm_eps!r}")
        if not 0 < self.partial_rotary_factor <= 1:
            raise ValueError(f"partial_rotary_factor must be in (0, 1], got {self.partial_rotary_factor!r}")
        if self.position == "rope":
            if not self.rope_theta > 0:
                raise ValueError(f"rope_theta must be positive, got {self.rope_theta!r}")
            if self.rotary_dim % 2 or self.rotary_dim == 0:
                raise ValueError(f"rotary width must be even and positive (head_dim {self.head_dim} x "
                                 f"partial_rotary_factor {self.partial_rotary_factor} = {self.rotary_dim}): "
                                 "RoPE rotates pairs")
        if self.sliding_window is not None and (not isinstance(self.sliding_window, int) or self.sliding_window <= 0):
            raise ValueError(f"sliding_window must be a positive integer or None, got {self.sliding_window!r}")
        if self.rope_scaling is not None:
            validate_rope_scaling(self)
        self._validate_descendants()

    def _validate_descendants(self) -> None:
        """The fields of the block's descendants (Gemma, Qwen3, Phi-3), and the mixes they refuse."""
        for name in ("attn_softcap", "final_softcap", "query_pre_attn_scalar", "local_rope_theta"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))
                                      or not math.isfinite(value) or value <= 0):
                raise ValueError(f"{name} must be a positive finite number or None, got {value!r}")
        if self.layer_types is not None:
            if not isinstance(self.layer_types, list) or len(self.layer_types) != self.n_layers:
                raise ValueError(f"layer_types must list one of {LAYER_TYPES} for each of the {self.n_layers} "
                                 f"layers, got {self.layer_types!r}")
            bad = next((k for k in self.layer_types if k not in LAYER_TYPES), None)
            if bad is not None:
                raise ValueError(f"layer_types holds {bad!r}; each entry must be one of {LAYER_TYPES}")
            if "sliding" in self.layer_types and self.sliding_window is None:
                raise ValueError("layer_types has sliding layers but sliding_window is not set: give the window")
        if (self.qk_norm or self.sandwich_norm) and self.norm != "rmsnorm":
            raise ValueError("qk_norm and sandwich_norm are RMSNorm designs; set norm='rmsnorm'")
        if self.sandwich_norm and self.norm_placement != "pre":
            raise ValueError("sandwich_norm adds a norm after each sub-layer of a pre-LN block; "
                             "set norm_placement='pre' (post-LN already normalizes after the add)")
        if self.position != "rope" and (self.qk_norm or self.local_rope_theta is not None):
            raise ValueError(f"qk_norm and local_rope_theta belong to RoPE models, not position={self.position!r}")
        if self.local_rope_theta is not None and "sliding" not in self.layer_kinds:
            raise ValueError("local_rope_theta is the RoPE base of sliding layers, and this model has none")

    # Derived sizes ---------------------------------------------------------------------
    @property
    def rotary_dim(self) -> int:
        return int(self.head_dim * self.partial_rotary_factor)

    @property
    def layer_kinds(self) -> list[str]:
        """"full" or "sliding" for each layer (sliding layers attend to their last sliding_window tokens)."""
        if self.layer_types is not None:
            return list(self.layer_types)
        return ["sliding" if self.sliding_window else "full"] * self.n_layers

    @property
    def group_size(self) -> int:
        """Query heads per key-value head (1 = MHA, n_heads = MQA)."""
        return self.n_heads // self.n_kv_heads

    def layer_shapes(self) -> dict[str, tuple[int, int]]:
        """(out, in) of one block's projections, by our parameter names: what a loader compares with
        a checkpoint's tensors before building anything (a config that lies about its sizes)."""
        q, kv = self.n_heads * self.head_dim, self.n_kv_heads * self.head_dim
        shapes = {"attn.wq": (q, self.d_model), "attn.wk": (kv, self.d_model), "attn.wv": (kv, self.d_model),
                  "attn.wo": (self.d_model, q)}
        if self.ffn in ("swiglu", "geglu"):
            shapes.update({"ffn.w_gate": (self.d_ff, self.d_model), "ffn.w_up": (self.d_ff, self.d_model),
                           "ffn.w_down": (self.d_model, self.d_ff)})
        return shapes

    def kv_bytes_per_token(self, bytes_per_element: int = 2) -> int:
        """Cache bytes for one token over all layers: 2 (K and V) x layers x kv heads x head_dim x bytes."""
        return 2 * self.n_layers * self.n_kv_heads * self.head_dim * bytes_per_element

    def replace(self, **changes) -> "ModelConfig":
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "ModelConfig":
        known = {f.name for f in dataclasses.fields(cls)}
        required = [f.name for f in dataclasses.fields(cls)
                    if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
        missing = [name for name in required if name not in d]
        if missing:
            raise ValueError(f"config lacks {missing[0]!r} (every config needs {', '.join(required)})")
        unknown = sorted(set(d) - known)
        if unknown:
            raise ValueError(f"unknown config field(s) {unknown}; known fields are {sorted(known)}")
        return cls(**d)

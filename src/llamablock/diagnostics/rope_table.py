"""What each context-extension method does to each rotary pair (module section 15.2).

Pair i turns by theta_i per token; its wavelength is 2 pi / theta_i tokens. Trained on L tokens:
  * a pair with wavelength <= L has turned at least once, so every angle on its circle was seen
    in training; running longer shows it no new angle;
  * a slower pair (wavelength > L) saw only angles up to L theta_i. At a target length T it
    reaches angles never seen in training unless its frequency is divided by at least T/L.
A method multiplies each pair's frequency by 1/ratio_i (ratio 1 = unchanged, ratio s = fully
interpolated). Per pair we report the pair's view of the target length, T / ratio_i in trained
tokens, and two flags:
    unseen   wavelength > L and T / ratio_i > L: the pair turns past anything trained
    crowded  wavelength <= L and ratio_i > 1: a pair that was already resolved is slowed down,
             so neighbouring positions sit closer together than training ever showed
Both use a relative tolerance of 1e-3 so float32 rounding of an exact ratio does not count.

The module's claim at L = 4,096, T = 32,768, head width 128: unscaled, only slow pairs are
unseen; interpolation crowds the fast pairs; NTK leaves some middle pairs unseen (overshooting);
YaRN (and LLaMA 3.1's rule) leaves none. tests/diagnostics/test_rope_table.py checks it.

`compare_methods(train_len, target_len, head_dim, base)` is the pure function the command
line, the lab and the web page call. Frequencies come from rope_scaling.py, never re-derived.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from llamablock.config import ModelConfig
from llamablock.io.hf_config import (
    SUPPORTED,
    config_from_file,
    rope_settings,
)
from llamablock.io.resolve import read_json
from llamablock.presets import PRESETS, preset
from llamablock.rope_scaling import RopeSpec, original_length, rope_frequencies
from llamablock.util.reads import MAX_JSON, regular_file

TOL = 1e-3
# Methods compared, in the order of section 15.2. longrope needs per-pair factor lists that
# only a trained model has, so it appears only for a config that carries them.
METHODS = ("default", "linear", "ntk", "dynamic", "yarn", "llama3")
LABELS = {"default": "unchanged", "linear": "interpolation", "ntk": "NTK-aware", "dynamic": "dynamic NTK",
          "yarn": "YaRN", "llama3": "LLaMA 3.1"}


def method_scaling(method: str, train_len: int, target_len: int) -> dict[str, Any] | None:
    """The rope_scaling dict that extends `train_len` to `target_len` with `method`, s = T / L.

    Each uses its published defaults: yarn beta_fast 32, beta_slow 1; llama3 low/high frequency
    factors 1 and 4 (LLaMA 3.1). dynamic uses factor s and is evaluated at length T, where
    transformers' formula gives the bracket s^2 - s + 1 (more than s: dynamic overshoots least).
    """
    s = target_len / train_len
    return {
        "default": None,
        "linear": {"rope_type": "linear", "factor": s},
        "ntk": {"rope_type": "ntk", "factor": s},
        "dynamic": {"rope_type": "dynamic", "factor": s},
        "yarn": {"rope_type": "yarn", "factor": s, "original_max_position_embeddings": train_len},
        "llama3": {"rope_type": "llama3", "factor": s, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                   "original_max_position_embeddings": train_len},
    }[method]


def pair_records(cfg: RopeSpec | ModelConfig, train_len: int, target_len: int) -> tuple[list[dict[str, Any]], float]:
    """Per-pair records for the scaling `cfg` carries, evaluated at the target length, and the
    attention factor; the unscaled reference is the same settings without scaling."""
    base_freq, _ = rope_frequencies(cfg.replace(rope_scaling=None))
    scaled, attention = rope_frequencies(cfg, seq_len=target_len)
    rows = []
    for i, (f, g) in enumerate(zip(base_freq.double().tolist(), scaled.double().tolist(), strict=True)):
        wavelength, ratio = 2 * math.pi / f, f / g
        seen_all = wavelength <= train_len
        rows.append({
            "pair": i,
            "frequency": f,
            "wavelength": wavelength,
            "rotations_in_training": train_len / wavelength,
            "scaled_frequency": g,
            "scaled_wavelength": 2 * math.pi / g,
            "interpolation_ratio": ratio,
            "target_in_trained_tokens": target_len / ratio,
            "unseen_at_target": (not seen_all) and target_len / ratio > train_len * (1 + TOL),
            "crowded": seen_all and ratio > 1 + TOL,
        })
    return rows, float(attention)


def compare_methods(train_len: int, target_len: int, head_dim: int, base: float = 10000.0,
                    partial_rotary_factor: float = 1.0, methods: tuple[str, ...] = METHODS) -> list[dict[str, Any]]:
    """For each method: {"method", "label", "rope_scaling", "attention_factor", "pairs": [record, ...],
    "unseen_pairs": [i, ...], "crowded_pairs": [i, ...]}, records as in `pair_records`."""
    if not (isinstance(train_len, int) and isinstance(target_len, int) and 0 < train_len <= target_len):
        raise ValueError(f"need 0 < train_len <= target_len (integers), got train_len={train_len}, "
                         f"target_len={target_len}")
    out = []
    for method in methods:
        scaling = method_scaling(method, train_len, target_len)
        if scaling is not None and scaling["factor"] == 1.0:
            scaling = None  # nothing to extend: every method is the unscaled schedule
        # max_seq_len is the training length: dynamic NTK's original length.
        cfg = RopeSpec(base, int(head_dim * partial_rotary_factor), train_len, scaling)
        out.append(summarize(method, LABELS.get(method, method), scaling, *pair_records(cfg, train_len, target_len)))
    return out


def summarize(method: str, label: str, scaling, pairs: list[dict], attention: float) -> dict[str, Any]:
    return {"method": method, "label": label, "rope_scaling": scaling, "attention_factor": attention,
            "pairs": pairs, "unseen_pairs": [p["pair"] for p in pairs if p["unseen_at_target"]],
            "crowded_pairs": [p["pair"] for p in pairs if p["crowded"]]}


def config_method(cfg: RopeSpec | ModelConfig, train_len: int, target_len: int) -> dict[str, Any]:
    """The record for a config's own scaling (e.g. Llama 3.1's llama3 rule, a Phi-3 longrope list)."""
    kind = (cfg.rope_scaling or {}).get("rope_type", "default")
    return summarize("config", f"this config ({kind})", cfg.rope_scaling, *pair_records(cfg, train_len, target_len))


# Reading the RoPE fields of a config ----------------------------------------------------------
DEFAULT_TRAIN, DEFAULT_TARGET = 4096, 32768  # the module's example: trained on 4k, run at 32k


@dataclass(frozen=True)
class RopeConfig:
    """The fields of a model config that position encoding reads: enough for the per-pair table
    (or, for ALiBi, the heads' slopes). `spec` is None when the model does not use RoPE."""

    family: str
    position: str
    n_heads: int
    head_dim: int
    partial_rotary_factor: float
    spec: RopeSpec | None


def read_rope_config(source: str) -> RopeConfig:
    """A preset name, or a config.json (llamablock's or transformers'). A transformers config of a
    family llamablock cannot run (Phi-3 with longrope, say) is read for its RoPE fields alone."""
    if source in PRESETS:
        cfg = preset(source)
    elif not Path(source).exists():
        raise ValueError(f"--config {source!r} is neither a preset ({', '.join(sorted(PRESETS))}) nor an existing file")
    else:
        d = read_json(regular_file(source, "config file", MAX_JSON))
        if "model_type" in d and d["model_type"] not in SUPPORTED:
            return _foreign(d, source)
        cfg = config_from_file(source)
    spec = RopeSpec.of(cfg) if cfg.position == "rope" else None
    return RopeConfig(cfg.family, cfg.position, cfg.n_heads, cfg.head_dim, cfg.partial_rotary_factor, spec)


def _foreign(d: dict, source: str) -> RopeConfig:
    heads, hidden = d.get("num_attention_heads"), d.get("hidden_size")
    if not (isinstance(heads, int) and isinstance(hidden, int) and heads > 0 and hidden > 0):
        raise ValueError(f"{source}: num_attention_heads and hidden_size must be positive integers to find the head width")
    theta, scaling, partial = rope_settings(d)
    head_dim = d.get("head_dim") or hidden // heads
    spec = RopeSpec(theta, int(head_dim * partial), d.get("max_position_embeddings", 2048), scaling)
    return RopeConfig(str(d["model_type"]), "rope", heads, head_dim, partial, spec)


def pair_table(cfg: RopeConfig | None = None, train_len: int | None = None, target_len: int | None = None,
               head_dim: int | None = None, base: float | None = None) -> dict[str, Any]:
    """`llamablock rope`'s result: every method's per-pair records at train_len -> target_len, plus
    the config's own scaling as a column when it has one. Lengths default to the config's (its
    original length and context when it scales, else its context and 8 times that), and to the
    module's 4,096 -> 32,768 without a config; head width and base to the config's, else 128 and 10,000."""
    spec = cfg.spec if cfg is not None else None
    scales = spec is not None and spec.rope_scaling is not None
    if spec is not None:
        train = train_len or (original_length(spec) if scales else spec.max_seq_len)
        target = target_len or (spec.max_seq_len if scales and spec.max_seq_len > train else 8 * train)
    else:
        train, target = train_len or DEFAULT_TRAIN, target_len or DEFAULT_TARGET
    own = scales and head_dim is None and base is None  # the config's own scaling fits these pairs
    head_dim = head_dim or (cfg.head_dim if cfg else 128)
    base = base or (spec.rope_theta if spec else 10000.0)
    partial = cfg.partial_rotary_factor if cfg else 1.0
    for name, v in (("--train-len", train), ("--target-len", target), ("--head-dim", head_dim)):
        if v <= 0:
            raise ValueError(f"{name} must be positive, got {v}")
    if target < train:
        raise ValueError(f"--target-len ({target}) must be at least --train-len ({train})")
    if not base > 0:
        raise ValueError(f"--base must be positive, got {base}")
    if int(head_dim * partial) % 2 or int(head_dim * partial) < 4:
        raise ValueError(f"--head-dim {head_dim} (x partial rotary {partial}) must give an even rotary width >= 4")
    records = compare_methods(train, target, head_dim, base, partial)
    if own:
        records.append(config_method(spec, train, target))
    return dict(train_len=train, target_len=target, head_dim=head_dim, base=base,
                partial_rotary_factor=partial, methods=records)

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
YaRN (and LLaMA 3.1's rule) leaves none. tests/test_rope_table.py checks it.

`compare_methods(train_len, target_len, head_dim, base)` is the pure function the command
line, the lab and the web page call. Frequencies come from rope_scaling.py, never re-derived.
"""

from __future__ import annotations

import math
from typing import Any

from llamablock.config import ModelConfig
from llamablock.rope_scaling import rope_frequencies

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


def _config(head_dim: int, base: float, train_len: int, partial_rotary_factor: float, scaling) -> ModelConfig:
    # A one-head config is all the frequencies need; max_seq_len is dynamic's original length.
    return ModelConfig(vocab_size=1, d_model=head_dim, n_layers=1, n_heads=1, head_dim=head_dim, d_ff=1,
                       max_seq_len=train_len, rope_theta=base, partial_rotary_factor=partial_rotary_factor,
                       rope_scaling=scaling)


def pair_records(cfg: ModelConfig, train_len: int, target_len: int) -> tuple[list[dict[str, Any]], float]:
    """Per-pair records for the scaling `cfg` carries, evaluated at the target length, and the
    attention factor; the unscaled reference is the same config without scaling."""
    base_freq, _ = rope_frequencies(cfg.replace(rope_scaling=None))
    scaled, attention = rope_frequencies(cfg, seq_len=target_len)
    rows = []
    for i, (f, g) in enumerate(zip(base_freq.double().tolist(), scaled.double().tolist())):
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
        cfg = _config(head_dim, base, train_len, partial_rotary_factor, scaling)
        out.append(summarize(method, LABELS.get(method, method), scaling, *pair_records(cfg, train_len, target_len)))
    return out


def summarize(method: str, label: str, scaling, pairs: list[dict], attention: float) -> dict[str, Any]:
    return {"method": method, "label": label, "rope_scaling": scaling, "attention_factor": attention,
            "pairs": pairs, "unseen_pairs": [p["pair"] for p in pairs if p["unseen_at_target"]],
            "crowded_pairs": [p["pair"] for p in pairs if p["crowded"]]}


def config_method(cfg: ModelConfig, train_len: int, target_len: int) -> dict[str, Any]:
    """The record for a config's own scaling (e.g. Llama 3.1's llama3 rule, a Phi-3 longrope list)."""
    kind = (cfg.rope_scaling or {}).get("rope_type", "default")
    return summarize("config", f"this config ({kind})", cfg.rope_scaling, *pair_records(cfg, train_len, target_len))

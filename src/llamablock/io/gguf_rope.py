"""RoPE scaling as a GGUF file declares it, read back as a transformers-style `rope_scaling` dict.

llama.cpp's converter (convert_hf_to_gguf.py) writes a model's context extension in one of two
ways, and the GGUF loader must read both or the model runs with frequencies it was not trained
with, which shows only in its outputs, not as an error:

  * metadata `<arch>.rope.scaling.type` = `linear` or `yarn`, with `.factor` and, for YaRN,
    `.original_context_length` and optionally `.yarn_beta_fast` / `.yarn_beta_slow`;
  * LLaMA 3.1's rescaling (`"rope_type": "llama3"` in config.json) has no metadata. The converter
    computes each rotary pair's divisor (1 for wavelengths below original / high_freq_factor,
    `factor` above original / low_freq_factor, 1 / ((1 - smooth) / factor + smooth) between) and
    stores them as the tensor `rope_freqs.weight`, (rotary_dim/2,) float32; llama.cpp divides
    pair i's angle by entry i (`ggml_rope_ext`'s freq_factors).

The tensor is read back as the `llama3` type with the constants every LLaMA 3.x checkpoint uses
(low_freq_factor 1, high_freq_factor 4, original length 8192; factor = the largest divisor),
after checking that they reproduce every divisor to a relative 1e-5 (the file holds float32
values of a float64 formula). Divisors they do not reproduce, YaRN variants whose extra keys have
no transformers counterpart here (DeepSeek's log multiplier, an ext_factor or attention factor
other than 1) and other types are refused by name, never run with other frequencies.

The YaRN mapping is exact: llama.cpp's `rope_yarn` (ext_factor 1, attn_factor 1, corr dims
floored and ceiled) and transformers' yarn compute the same ramp and the same 0.1 ln s + 1.

transformers' own GGUF loader (5.x) maps neither for llama/qwen2 files: its config mapping has no
rope.scaling keys and it skips `rope_freqs`, so it runs such a file with plain RoPE
(tests/io/test_gguf_rope.py checks this, so that the claim is retired when it stops being true).
"""

from __future__ import annotations

import numpy as np
import torch

from llamablock.config import ModelConfig
from llamablock.io.gguf_meta import number
from llamablock.rope_scaling import default_inv_freq, rope_frequencies

# LLaMA 3.x's llama3 constants (config.json of Llama 3.1, 3.2 and 3.3; llama-models' apply_scaling).
LLAMA3_CONSTANTS = {"low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}


def pair_divisors(cfg: ModelConfig) -> torch.Tensor:
    """What llama.cpp's `rope_freqs` would hold for `cfg`: default theta_i / scaled theta_i, (rotary_dim/2,)."""
    return default_inv_freq(cfg.rope_theta, cfg.rotary_dim) / rope_frequencies(cfg)[0]


def llama3_from_divisors(cfg: ModelConfig, divisors: np.ndarray) -> dict | None:
    """The llama3 dict whose divisors are `divisors` (None when all are 1), or ValueError."""
    divisors = np.asarray(divisors, dtype=np.float64).reshape(-1)
    if divisors.shape != (cfg.rotary_dim // 2,):
        raise ValueError(f"GGUF tensor rope_freqs.weight has {divisors.size} entries; the rotary width "
                         f"{cfg.rotary_dim} needs {cfg.rotary_dim // 2}")
    if not np.all(np.isfinite(divisors)) or np.any(divisors <= 0):
        raise ValueError("GGUF tensor rope_freqs.weight holds a divisor that is not a positive number")
    if np.all(divisors == 1.0):
        return None
    scaling = {"rope_type": "llama3", "factor": float(divisors.max()), **LLAMA3_CONSTANTS}
    expected = pair_divisors(cfg.replace(rope_scaling=scaling)).double().numpy()
    worst = float(np.max(np.abs(expected - divisors) / divisors))
    if worst > 1e-5:
        raise ValueError(
            f"GGUF tensor rope_freqs.weight is not LLaMA 3.1's rescaling with factor {scaling['factor']:g}, "
            f"low_freq_factor 1, high_freq_factor 4, original length 8192 (largest relative difference "
            f"{worst:.2g}); llamablock maps only that one, so the file is refused rather than run with "
            "other frequencies; load the transformers checkpoint instead")
    return scaling


def _number(meta: dict, key: str):
    return number(meta, key, float, None)  # a string or an array there is refused, naming the key


def scaling_from_metadata(meta: dict, arch: str, context_length: int) -> dict | None:
    """`<arch>.rope.scaling.*` as a transformers dict (None for no scaling), or ValueError."""
    key = f"{arch}.rope.scaling."
    kind = meta.get(key + "type")
    factor = _number(meta, key + "factor")
    if kind is None or kind == "none" or (kind == "linear" and factor in (None, 1.0)):
        return None
    if factor is None or factor < 1:
        raise ValueError(f"GGUF metadata {key}factor is {factor!r}; a {kind} scaling needs a factor >= 1")
    if kind == "linear":
        return {"rope_type": "linear", "factor": factor}
    if kind != "yarn":
        raise ValueError(f"GGUF RoPE scaling type {kind!r} is not supported (llamablock maps linear, yarn and "
                         "LLaMA 3.1's rope_freqs); load the transformers checkpoint instead")
    # Keys that change YaRN's formula away from transformers' yarn: refuse them rather than drop them.
    unmapped = {"yarn_log_multiplier": 0.0, "yarn_ext_factor": 1.0, "attn_factor": 1.0, "yarn_attn_factor": 1.0}
    for name, neutral in unmapped.items():
        value = _number(meta, key + name)
        if value is not None and value != neutral and not (name == "yarn_ext_factor" and value < 0):
            raise ValueError(f"GGUF metadata {key}{name} = {value:g} changes YaRN in a way llamablock does not "
                             "map; load the transformers checkpoint instead")
    original = meta.get(key + "original_context_length") or context_length
    scaling = {"rope_type": "yarn", "factor": factor, "original_max_position_embeddings": int(original)}
    for name in ("beta_fast", "beta_slow"):
        value = _number(meta, key + "yarn_" + name)
        if value is not None:
            scaling[name] = value
    return scaling


def rope_scaling_from_gguf(cfg: ModelConfig, meta: dict, arch: str, rope_freqs: np.ndarray | None) -> dict | None:
    """The file's RoPE scaling for `cfg` (built without it); ValueError for what is not mapped."""
    from_metadata = scaling_from_metadata(meta, arch, cfg.max_seq_len)
    if rope_freqs is None:
        return from_metadata
    if from_metadata is not None:
        raise ValueError(f"this GGUF declares both rope.scaling.type ({from_metadata['rope_type']}) and a "
                         "rope_freqs tensor; llamablock does not know which one llama.cpp would apply")
    return llama3_from_divisors(cfg, rope_freqs)

"""Warnings for RoPE settings in a transformers config.json that load but do not do what they say.

Each rule is a trap reported in the bug trackers of transformers, vLLM, llama.cpp and mlx-lm:
a scaling that is silently ignored shows only past the training length, so short tests pass.
`lint_config(d)` returns one `RopeWarning` per trap; each message is one line that says what
happens and what to write instead. Rules (names are stable, for filtering):

    ignored-type          scaling declared, but with no type or one transformers does not know
                          (it loads as plain RoPE, or not at all)
    mscale-cancels        yarn with mscale == mscale_all_dim: the attention factor becomes 1
    missing-original      yarn/llama3/longrope without original_max_position_embeddings, in the
                          scaling dict or at the top level (Phi-3 keeps it there): then
                          max_position_embeddings (the extended length) is taken as the original
    original-conflict     both places hold it, with different values: transformers' rotary
                          embedding re-standardizes and the top-level value wins
    factor-overridden     yarn factor != max_position_embeddings / original (ratio not 1):
                          transformers 4.x before PR #40320 used the ratio instead; transformers 5
                          uses factor, with a warning (ratio 1, Qwen2.5's published advice, is
                          silent here as in transformers)
    equal-freq-factors    llama3 low_freq_factor == high_freq_factor: a zero-width band (0/0 in
                          the reference formula); intended only for Llama 4
    odd-rotary-width      head_dim x partial_rotary_factor is odd: RoPE rotates pairs
    forms-disagree        both rope_scaling (v4) and rope_parameters (v5), different: transformers
                          5 reads rope_scaling and ignores rope_parameters, rope_theta included
    factor-below-one      factor < 1 shrinks the context instead of extending it

For a GGUF file (`lint_gguf`, or `lint_file` on a .gguf), the traps of llama.cpp's format:

    gguf-missing-rope-freqs  named LLaMA 3.1/3.2/3.3 with a context above 8192 but no rope_freqs
                          tensor and no rope.scaling: converted without LLaMA 3.1's rescaling
                          (converters before llama.cpp PR #8676, and forks that skipped
                          the tensor, ik_llama.cpp #402): every runtime runs it with plain RoPE
    gguf-unmapped         a scaling llamablock refuses to load (io/gguf_rope.py says why)
    gguf-transformers-plain  the file scales RoPE; transformers' GGUF loader (5.x) ignores both
                          rope.scaling and rope_freqs for llama/qwen2 files and runs plain RoPE
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from llamablock.io.resolve import read_json
from llamablock.util.reads import MAX_JSON, regular_file

# The types transformers 5 computes (ROPE_INIT_FUNCTIONS plus "default"); "ntk" is llamablock's own.
TRANSFORMERS_TYPES = ("default", "linear", "dynamic", "yarn", "longrope", "llama3", "proportional")
_NEEDS_ORIGINAL = ("yarn", "llama3", "longrope")
_SHARED_KEYS = ("rope_theta", "partial_rotary_factor")  # may sit beside or inside the scaling dict


@dataclass(frozen=True)
class RopeWarning:
    rule: str
    message: str

    def __str__(self) -> str:
        return f"{self.rule}: {self.message}"


def _kind(d: dict) -> str | None:
    return d.get("rope_type", d.get("type"))


def _scaling(hf: dict) -> tuple[str, dict]:
    """The dict transformers 5 will use, and the key it came from (rope_scaling wins)."""
    for key in ("rope_scaling", "rope_parameters"):
        if isinstance(hf.get(key), dict) and hf[key]:
            return key, hf[key]
    return "", {}


def lint_config(hf: dict[str, Any]) -> list[RopeWarning]:
    out: list[RopeWarning] = []
    warn = lambda rule, msg: out.append(RopeWarning(rule, msg))  # noqa: E731
    legacy, params = hf.get("rope_scaling"), hf.get("rope_parameters")
    if isinstance(legacy, dict) and legacy and isinstance(params, dict) and params:
        a = {k: v for k, v in legacy.items() if k not in ("type", "rope_type", *_SHARED_KEYS)}
        b = {k: v for k, v in params.items() if k not in ("type", "rope_type", *_SHARED_KEYS)}
        theta_a = legacy.get("rope_theta", hf.get("rope_theta", 10000.0))
        if a != b or _kind(legacy) != _kind(params) or theta_a != params.get("rope_theta", theta_a):
            warn("forms-disagree", f"rope_scaling {legacy} and rope_parameters {params} differ; transformers 5 uses "
                 "rope_scaling (with top-level rope_theta) and ignores rope_parameters: keep only rope_parameters")
    key, p = _scaling(hf)
    kind = _kind(p) if p else None
    has_scaling_fields = any(k not in ("type", "rope_type", *_SHARED_KEYS) for k in p)
    if p and kind is None and has_scaling_fields:
        warn("ignored-type", f"{key} has {sorted(k for k in p if k not in _SHARED_KEYS)} but no rope_type: it loads "
             "as plain RoPE and the scaling is ignored; add \"rope_type\" (e.g. \"linear\", \"yarn\", \"llama3\")")
    elif kind == "default" and has_scaling_fields:
        warn("ignored-type", f"{key}.rope_type is \"default\" but {key} also sets "
             f"{sorted(k for k in p if k not in ('type', 'rope_type', *_SHARED_KEYS))}: they are ignored; "
             "set rope_type to the method those fields belong to")
    elif kind is not None and kind not in TRANSFORMERS_TYPES:
        extra = " (llamablock's own static NTK: transformers will not load it)" if kind == "ntk" else ""
        warn("ignored-type", f"{key}.rope_type {kind!r} is not a transformers type{extra}; transformers "
             f"raises or falls back, llama.cpp and vLLM may ignore it; use one of {list(TRANSFORMERS_TYPES)}")
    factor = p.get("factor")
    if isinstance(factor, (int, float)) and not isinstance(factor, bool) and factor < 1:
        warn("factor-below-one", f"{key}.factor is {factor}: below 1 it shrinks the usable context; write the "
             "extension ratio, new length / trained length (e.g. 4.0 for 32k -> 128k)")
    max_pos = hf.get("max_position_embeddings")
    original = p.get("original_max_position_embeddings")
    top = hf.get("original_max_position_embeddings")
    if kind in _NEEDS_ORIGINAL and original is None and top is None:
        warn("missing-original", f"{key} ({kind}) has no original_max_position_embeddings: transformers takes "
             f"max_position_embeddings ({max_pos}), the extended length, as the trained one; add the training length")
    if kind in _NEEDS_ORIGINAL and original is not None and top is not None and original != top:
        warn("original-conflict", f"original_max_position_embeddings is {top} at the top level but {original} in "
             f"{key}; transformers' rotary embedding uses the top-level {top}: keep one value, inside {key}")
    original = top or original
    if kind == "yarn" and isinstance(factor, (int, float)) and original and max_pos:
        implicit = max_pos / original
        if implicit not in (1, factor):  # transformers 5 warns on the same condition
            warn("factor-overridden", f"{key}.factor is {factor} but max_position_embeddings / "
                 f"original_max_position_embeddings = {max_pos}/{original} = {implicit:g}; transformers 4.x (before "
                 f"PR #40320) used {implicit:g}, current transformers uses {factor}: make them agree "
                 f"(max_position_embeddings = {factor} x {original})")
    if kind == "yarn" and p.get("attention_factor") is None and p.get("mscale") and \
            p.get("mscale") == p.get("mscale_all_dim"):
        warn("mscale-cancels", f"{key}.mscale == mscale_all_dim ({p['mscale']}): their ratio is 1, so YaRN's "
             "0.1 ln(s) + 1 attention factor is dropped; remove both for the paper's factor, or set "
             "attention_factor explicitly if 1 is intended")
    if kind == "llama3" and p.get("low_freq_factor") is not None and \
            p.get("low_freq_factor") == p.get("high_freq_factor"):
        warn("equal-freq-factors", f"{key}.low_freq_factor == high_freq_factor ({p['low_freq_factor']}): the blend "
             "band has zero width and the reference formula divides by zero on its edge; unless this is Llama 4's "
             "step on purpose, write Llama 3.1's low_freq_factor 1.0, high_freq_factor 4.0")
    heads, hidden = hf.get("num_attention_heads"), hf.get("hidden_size")
    head_dim = hf.get("head_dim") or (hidden // heads if heads and hidden else None)
    partial = p.get("partial_rotary_factor", hf.get("partial_rotary_factor", 1.0))
    if head_dim and int(head_dim * partial) % 2:
        warn("odd-rotary-width", f"rotary width head_dim x partial_rotary_factor = {head_dim} x {partial} = "
             f"{int(head_dim * partial)} is odd; RoPE turns pairs, so one feature has no partner: choose a "
             "partial_rotary_factor that gives an even width")
    return out


def lint_gguf(path: str | Path) -> list[RopeWarning]:
    """The GGUF rules above, from the file's metadata and tensor names (of the tensors, only the small
    rope_freqs is read)."""
    from llamablock.io.gguf import (
        config_from_gguf,
        metadata,
        open_gguf,
        rope_scaling_of,
    )
    from llamablock.io.tensor_names import ROPE_FREQS

    reader = open_gguf(path)
    meta = metadata(reader)
    arch = meta.get("general.architecture")
    name = " ".join(str(meta.get(k, "")) for k in ("general.name", "general.basename", "general.finetune"))
    # What the file carries; for an architecture llamablock reads, the loader's reading replaces it below.
    declares = (meta.get(f"{arch}.rope.scaling.type", "none") != "none"
                or any(t.name == ROPE_FREQS for t in reader.tensors))
    out: list[RopeWarning] = []
    context = meta.get(f"{arch}.context_length", 0)
    if re.search(r"llama[-_ ]?3[._ -]?[123]\b", name, re.IGNORECASE) and context > 8192 and not declares:
        out.append(RopeWarning("gguf-missing-rope-freqs", f"{name.strip()!r} has a {context}-token context but no "
                               "rope_freqs tensor: LLaMA 3.1-3.3 were trained with the llama3 rescaling, which "
                               "this file lost in conversion, so every runtime runs it with plain RoPE; reconvert "
                               "it with a current convert_hf_to_gguf.py"))
    try:
        cfg = config_from_gguf(reader, rope_scaling=False)
    except ValueError:
        cfg = None  # an architecture llamablock does not run: its RoPE is not read here
    if cfg is not None:
        try:
            declares = rope_scaling_of(reader, cfg) is not None  # an identity scaling (factor 1) scales nothing
        except ValueError as e:
            out.append(RopeWarning("gguf-unmapped", str(e)))
    if declares:
        out.append(RopeWarning("gguf-transformers-plain", "this file scales RoPE; transformers' GGUF loader (5.x) "
                               "ignores rope.scaling and rope_freqs and runs it with plain RoPE: load it with "
                               "llamablock or llama.cpp, or load the transformers checkpoint in transformers"))
    return out


def lint_file(path: str | Path) -> list[RopeWarning]:
    """A transformers config.json, or a .gguf file (by its suffix). Either must be a regular file
    (a FIFO hung the read, /dev/zero exhausted memory) and a config at most MAX_JSON bytes."""
    if Path(path).suffix.lower() == ".gguf":
        return lint_gguf(regular_file(path, "GGUF file"))
    return lint_config(read_json(regular_file(path, "config file", MAX_JSON)))

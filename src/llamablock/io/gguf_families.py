"""The block's descendants in GGUF files: Gemma, Gemma 2, Gemma 3, Qwen3, Phi-3 (io/gguf.py reads them).

What llama.cpp's converter (convert_hf_to_gguf.py) writes for each, and what its loader assumes
where the file is silent, restated so that a file means here what it means in llama.cpp. Each
family's constants (defaults, layer pattern, caps, the 27B block counts) are its record in
families.py; this module reads the file's keys and tensors against it:

    gemma*   GeGLU, embeddings times sqrt(d_model), tied head (Gemma and Gemma 2 files hold no
             `output` tensor); every RMSNorm scale stored as 1 + w (`GemmaModel.modify_tensors`),
             so the record's offset is subtracted on load and the model keeps Gemma's (1 + w) form,
             as transformers' GGUF loader does.
    gemma2   `attn_logit_softcapping`, `final_logit_softcapping`, `attention.sliding_window` on
             the local layers of the record's pattern; post-sub-layer norms `post_attention_norm`,
             `post_ffw_norm`.
    gemma3   no capping; q/k norms `attn_q_norm`, `attn_k_norm`; local layers at their own base,
             unscaled (`rope.freq_base_swa` when the file has it), the global ones at
             `rope.freq_base` with the file's linear scaling.
    both     scores scaled by head_dim^-1/2, except the 27B models, scaled by (d_model / heads)^-1/2:
             llama.cpp's rule, since query_pre_attn_scalar is not in the file.
    qwen3    q/k norms.
    phi3     `attn_qkv` and `ffn_up` hold the fused q|k|v and gate|up rows (split here); LongRoPE as
             the tensors `rope_factors_short` / `rope_factors_long` with `rope.scaling.original_context_length`
             and `rope.scaling.attn_factor`; a window on every layer when `attention.sliding_window` is set.
None of these permutes q/k rows: llama.cpp rotates them in NEOX mode, the half layout.
"""

from __future__ import annotations

import torch

from llamablock.families import FAMILIES, GGUF_ARCHS, Family
from llamablock.io.gguf_meta import number
from llamablock.io.tensor_names import GGUF_FUSED, ROPE_FACTORS, gguf_name, split_rows


def family_fields(fam: Family, meta: dict, names: set[str], base: dict) -> dict:
    """ModelConfig fields the family (its record, families.py) adds to the llama ones in `base`
    (which it reads): the record's own, then what the file's keys and tensors say."""
    def key(k):
        return f"{fam.gguf}.{k}"

    n_layers, d_model = base["n_layers"], base["d_model"]
    out = dict(fam.fields(d_model, n_layers), tie_embeddings=base["tie_embeddings"], qkv_bias=base["qkv_bias"],
               qk_norm=_qk_norms(names, n_layers, fam), query_pre_attn_scalar=None)
    if fam.window == "local":  # llama.cpp reads the window and places the global layers itself
        window = meta.get(key("attention.sliding_window"))
        if not isinstance(window, int) or isinstance(window, bool) or window <= 0:
            raise ValueError(f"GGUF metadata lacks {key('attention.sliding_window')} (a positive integer), which "
                             f"{fam.gguf} needs for its local layers; got {window!r}")
        large = n_layers == fam.gguf_27b_blocks
        out.update(sliding_window=window, layer_types=fam.layer_pattern(n_layers),
                   query_pre_attn_scalar=float(d_model // base["n_heads"] if large else base["head_dim"]))
    elif fam.window == "all":
        out["sliding_window"] = number(meta, key("attention.sliding_window"), int, None, positive=True)
    # llama.cpp reads a cap where the family caps by default (Gemma 2), and no cap key elsewhere
    for theirs, default in fam.softcaps.items():
        if default is None:
            continue
        value = meta.get(key(theirs), default)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
            raise ValueError(f"GGUF metadata {key(theirs)} must be a positive number, got {value!r}")
        out[_CAPS[theirs]] = float(value)
    if fam.local_rope_theta is not None:
        out["local_rope_theta"] = number(meta, key("rope.freq_base_swa"), float, fam.local_rope_theta, positive=True)
    return out


_CAPS = {"attn_logit_softcapping": "attn_softcap", "final_logit_softcapping": "final_softcap"}  # key -> field


def _qk_norms(names: set[str], n_layers: int, fam: Family) -> bool:
    """Whether the blocks norm q and k per head: the family's (Qwen 3, Gemma 3) always, with every
    block's tensors. A file lacking one is refused naming the first one missing (deciding by block 0
    alone reported an unused tensor elsewhere)."""
    if not fam.qk_norm:
        return False
    wanted = [gguf_name(f"layers.{i}.attn.{x}_norm.weight") for i in range(n_layers) for x in ("q", "k")]
    present = [n for n in wanted if n in names]
    if len(present) != len(wanted):
        missing = next(n for n in wanted if n not in names)
        raise ValueError(f"GGUF file lacks tensor {missing!r}: {fam.gguf} norms q and k per head "
                         f"({len(present)} of the {len(wanted)} tensors are present); the file is incomplete")
    return True


def phi3_longrope(arch: str, meta: dict, factors: dict[str, torch.Tensor]) -> dict | None:
    """Phi-3's LongRoPE dict (transformers' form) from the factor tensors, or None without them."""
    if not GGUF_ARCHS[arch].gguf_longrope or not factors:
        return None
    if set(factors) != set(ROPE_FACTORS):
        raise ValueError(f"GGUF file holds {sorted(factors)} but LongRoPE needs both {list(ROPE_FACTORS)}")
    original = number(meta, f"{arch}.rope.scaling.original_context_length", int, positive=True)
    scaling = {"rope_type": "longrope", "original_max_position_embeddings": original,
               "long_factor": [float(x) for x in factors["rope_factors_long.weight"].reshape(-1)],
               "short_factor": [float(x) for x in factors["rope_factors_short.weight"].reshape(-1)]}
    attn = number(meta, f"{arch}.rope.scaling.attn_factor", float, None, positive=True)
    if attn is not None:
        scaling["attention_factor"] = attn
    return scaling


def split_gguf_fused(gguf_kind: str, layer: str, w: torch.Tensor, cfg) -> list[tuple[str, torch.Tensor]]:
    """Phi-3's fused tensor `w` of `layer` ("layers.N") as (our name, rows) for each part, in row order."""
    pieces = split_rows(w, GGUF_FUSED[gguf_kind], cfg, f"blk.{layer.split('.')[1]}.{gguf_kind}.weight")
    return [(f"{layer}.{part}.weight", piece.contiguous()) for part, piece in zip(GGUF_FUSED[gguf_kind], pieces, strict=True)]


def is_fused(family: str, gguf_kind: str) -> bool:
    """Whether a GGUF tensor kind holds several of our tensors in this family's files (Phi-3's)."""
    return FAMILIES[family].fused and gguf_kind in GGUF_FUSED


def unshift_norm(arch: str, name: str, w: torch.Tensor) -> torch.Tensor:
    """Gemma's stored 1 + w back to w (the model adds the 1 in float32, as transformers does)."""
    norm = name.rsplit(".", 2)[-2].rstrip("0123456789").endswith("norm")  # norm1, post_norm2, q_norm, final_norm
    offset = GGUF_ARCHS[arch].norm_offset
    return w - offset if offset and norm else w

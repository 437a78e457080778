"""The block's descendants in GGUF files: Gemma, Gemma 2, Gemma 3, Qwen3, Phi-3 (io/gguf.py reads them).

What llama.cpp's converter (convert_hf_to_gguf.py) writes for each, and what its loader assumes
where the file is silent, restated so that a file means here what it means in llama.cpp:

    gemma*   GeGLU, embeddings times sqrt(d_model), tied head (Gemma and Gemma 2 files hold no
             `output` tensor); every RMSNorm scale stored as 1 + w (`GemmaModel.modify_tensors`),
             so 1 is subtracted on load and the model keeps Gemma's (1 + w) form, as transformers'
             GGUF loader does.
    gemma2   `attn_logit_softcapping`, `final_logit_softcapping`, `attention.sliding_window` on
             alternate layers (even layers local); post-sub-layer norms `post_attention_norm`,
             `post_ffw_norm`.
    gemma3   no capping; q/k norms `attn_q_norm`, `attn_k_norm`; five local layers to one global,
             local layers at base 10,000 unscaled (`rope.freq_base_swa` when the file has it), the
             global ones at `rope.freq_base` with the file's linear scaling.
    both     scores scaled by head_dim^-1/2, except the 27B models (46 and 62 blocks), scaled by
             (d_model / heads)^-1/2: llama.cpp's rule, since query_pre_attn_scalar is not in the file.
    qwen3    q/k norms.
    phi3     `attn_qkv` and `ffn_up` hold the fused q|k|v and gate|up rows (split here); LongRoPE as
             the tensors `rope_factors_short` / `rope_factors_long` with `rope.scaling.original_context_length`
             and `rope.scaling.attn_factor`; a window on every layer when `attention.sliding_window` is set.
None of these permutes q/k rows: llama.cpp rotates them in NEOX mode, the half layout.
"""

from __future__ import annotations

import math

import torch

from llamablock.io.gguf_meta import number
from llamablock.io.hf_checkpoint import split_rows

# GGUF architecture -> our family name.
FAMILIES = {"gemma": "gemma", "gemma2": "gemma2", "gemma3": "gemma3_text", "qwen3": "qwen3", "phi3": "phi3"}
LAYER_NAMES = {"attn_q_norm": "attn.q_norm", "attn_k_norm": "attn.k_norm", "post_attention_norm": "post_norm1",
               "post_ffw_norm": "post_norm2"}
FUSED = {"attn_qkv": ("attn.wq", "attn.wk", "attn.wv"), "ffn_up": ("ffn.w_gate", "ffn.w_up")}  # Phi-3's rows
ROPE_FACTORS = ("rope_factors_long.weight", "rope_factors_short.weight")
_LARGE_GEMMA = {"gemma2": 46, "gemma3": 62}  # block counts of the 27B models (llama.cpp's LLM_TYPE_27B)


def is_gemma(arch: str) -> bool:
    return arch.startswith("gemma")


def family_fields(arch: str, meta: dict, names: set[str], base: dict) -> dict:
    """ModelConfig fields this architecture adds to the llama ones in `base` (which it reads)."""
    def key(k):
        return f"{arch}.{k}"

    n_layers, d_model = base["n_layers"], base["d_model"]
    out: dict = {"family": FAMILIES[arch], "qk_norm": _qk_norms(names, n_layers)}
    if is_gemma(arch):
        out.update(ffn="geglu", norm_offset=1.0, embed_scale=math.sqrt(d_model))
    if arch in ("gemma2", "gemma3"):
        window = meta.get(key("attention.sliding_window"))
        if not isinstance(window, int) or isinstance(window, bool) or window <= 0:
            raise ValueError(f"GGUF metadata lacks {key('attention.sliding_window')} (a positive integer), which "
                             f"{arch} needs for its local layers; got {window!r}")
        every = 2 if arch == "gemma2" else 6
        large = n_layers == _LARGE_GEMMA[arch]
        out.update(sandwich_norm=True, sliding_window=window,
                   layer_types=["full" if (i + 1) % every == 0 else "sliding" for i in range(n_layers)],
                   query_pre_attn_scalar=float(d_model // base["n_heads"] if large else base["head_dim"]))
    if arch == "gemma2":
        for ours, theirs, default in (("attn_softcap", "attn_logit_softcapping", 50.0),
                                      ("final_softcap", "final_logit_softcapping", 30.0)):
            value = meta.get(key(theirs), default)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
                raise ValueError(f"GGUF metadata {key(theirs)} must be a positive number, got {value!r}")
            out[ours] = float(value)
    if arch == "gemma3":
        out["local_rope_theta"] = number(meta, key("rope.freq_base_swa"), float, 10_000.0, positive=True)
    if arch == "phi3":
        out["sliding_window"] = number(meta, key("attention.sliding_window"), int, None, positive=True)
    return out


def _qk_norms(names: set[str], n_layers: int) -> bool:
    """Whether the blocks norm q and k per head (Qwen 3, Gemma 3): all of them or none. A file with
    some of these tensors missing is refused naming the first one missing (deciding by block 0
    alone reported an unused tensor elsewhere)."""
    wanted = [f"blk.{i}.attn_{x}_norm.weight" for i in range(n_layers) for x in ("q", "k")]
    present = [n for n in wanted if n in names]
    if present and len(present) != len(wanted):
        missing = next(n for n in wanted if n not in names)
        raise ValueError(f"GGUF file lacks tensor {missing!r}: other blocks norm q and k per head "
                         f"({len(present)} of the {len(wanted)} tensors are present); the file is incomplete")
    return bool(present)


def phi3_longrope(arch: str, meta: dict, factors: dict[str, torch.Tensor]) -> dict | None:
    """Phi-3's LongRoPE dict (transformers' form) from the factor tensors, or None without them."""
    if arch != "phi3" or not factors:
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


def split_fused(gguf_kind: str, layer: str, w: torch.Tensor, cfg) -> list[tuple[str, torch.Tensor]]:
    """Phi-3's fused tensor `w` of `layer` ("layers.N") as (our name, rows) for each part, in row order."""
    pieces = split_rows(w, FUSED[gguf_kind], cfg, f"blk.{layer.split('.')[1]}.{gguf_kind}.weight")
    return [(f"{layer}.{part}.weight", piece.contiguous()) for part, piece in zip(FUSED[gguf_kind], pieces)]


def is_fused(family: str, gguf_kind: str) -> bool:
    """Whether a GGUF tensor kind holds several of our tensors in this family's files (Phi-3's)."""
    return family == "phi3" and gguf_kind in FUSED


def unshift_norm(arch: str, name: str, w: torch.Tensor) -> torch.Tensor:
    """Gemma's stored 1 + w back to w (the model adds the 1 in float32, as transformers does)."""
    norm = name.rsplit(".", 2)[-2].rstrip("0123456789").endswith("norm")  # norm1, post_norm2, q_norm, final_norm
    return w - 1 if is_gemma(arch) and norm else w

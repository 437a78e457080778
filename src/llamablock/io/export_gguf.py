"""A trained model as one GGUF file, written with the `gguf` package as llama.cpp's converter does.

Architecture "llama", float32 tensors (file type ALL_F32), named as llama.cpp names them
(io/tensor_names.py's table read backwards). llama.cpp's llama rope rotates neighbouring pairs
("NORM" mode), so W_q and W_k are written in the "interleaved" row order: the module's presets
already train in it; a "half" model is permuted (convert_hf_to_gguf.py's `LlamaModel.permute`).

The tokenizer goes into the `tokenizer.ggml.*` metadata:
  * characters: the "llama" (SentencePiece) model, one token per character with a space spelled
    U+2581 as SentencePiece spells it, no space prefix, no BOS. A vocabulary of single characters
    has no pair to merge, so both llama.cpp and llamablock split text into its characters. The
    file names no end-of-text token (a character model has none); llama.cpp then falls back to
    its default id, so run it with `--ignore-eos` (llama-cli) to match llamablock's output.
  * byte-level BPE: the "gpt2" model with the vocabulary and merges of the trained tokenizer and
    GPT-2's pre-tokenizer, which is the split `tokenizers`' ByteLevel pre-tokenizer applies.

RoPE scaling, as llama.cpp's converter writes a transformers `rope_scaling` (its TextModel's
set_gguf_parameters; the key names are the `gguf` package's Keys.Rope):
  * linear: `llama.rope.scaling.type` "linear" and `.rope.scaling.factor`;
  * yarn: "yarn", the factor, `.rope.scaling.original_context_length` (llama.cpp's n_ctx_orig_yarn)
    and `.rope.scaling.yarn_beta_fast` / `.yarn_beta_slow` where the config sets them. An
    attention factor other than YaRN's own 0.1 ln s + 1 is refused: llama.cpp multiplies its own
    by `yarn_attn_factor` after version-dependent corrections, and llamablock's reader refuses it;
  * ntk (static, llamablock's own type): no scaling key, `.rope.freq_base` the raised base
    (rope_scaling.ntk_base), the same frequencies;
  * llama3 (llama.cpp stores it as a `rope_freqs` tensor, which llamablock reads back only with
    LLaMA 3's own constants) and dynamic NTK (llama.cpp has none) are refused: --format hf.
`llama.context_length` is the config's context, the scaled one (llama.cpp's n_ctx_train).

The key `llamablock.export` marks the file as llamablock's own (llama.cpp ignores keys it does
not know): a later export replaces only a file that carries it (io/export.py's export_target).
The file is written under a temporary name and renamed over OUT; a killed writer's temporary is
removed by the next export, and a full disk is reported as such, naming OUT.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from llamablock.io.tensor_names import gguf_name
from llamablock.model import Decoder
from llamablock.rope import permute_qk
from llamablock.rope_scaling import ntk_base, yarn_attention_factor
from llamablock.util.files import EXPORT_MARKER, atomic_write, clean_stale, disk_full

SPACE = "\u2581"  # SentencePiece's spelling of a space


def _interleaved_state(model: Decoder) -> dict[str, np.ndarray]:
    cfg = model.cfg
    out = {}
    for name, t in model.state_dict().items():
        if cfg.tie_embeddings and name == "head.weight":
            continue  # llama.cpp reuses token_embd when output.weight is absent
        kind = name.split(".")[-2] if name.startswith("layers.") else ""
        if cfg.rope_layout == "half" and kind in ("wq", "wk"):
            heads = cfg.n_heads if kind == "wq" else cfg.n_kv_heads
            t = permute_qk(t, heads, cfg.head_dim, cfg.rotary_dim, to="interleaved")
        out[gguf_name(name)] = t.detach().float().cpu().contiguous().numpy()
    return out


def _add_tokenizer(w, record: dict, vocab_size: int) -> None:
    import gguf

    if record.get("kind") == "char":
        tokens = [SPACE if c == " " else c for c in record["chars"]]
        w.add_tokenizer_model("llama")
        w.add_token_list(tokens)
        w.add_token_scores([0.0] * len(tokens))
        w.add_token_types([gguf.TokenType.NORMAL] * len(tokens))
        w.add_add_space_prefix(False)
        w.add_add_bos_token(False)
        w.add_add_eos_token(False)
    elif record.get("kind") == "bpe":
        model = record["tokenizer"]["model"]
        vocab = sorted(model["vocab"].items(), key=lambda kv: kv[1])
        tokens = [t for t, _ in vocab]
        if [i for _, i in vocab] != list(range(len(tokens))):
            raise ValueError("the BPE vocabulary's ids are not 0..n-1; it cannot be written as a GGUF token list")
        merges = [m if isinstance(m, str) else " ".join(m) for m in model["merges"]]
        w.add_tokenizer_model("gpt2")
        w.add_tokenizer_pre("gpt2")
        w.add_token_list(tokens)
        w.add_token_types([gguf.TokenType.NORMAL] * len(tokens))
        w.add_token_merges(merges)
        w.add_add_bos_token(False)
    else:
        raise ValueError(f"unknown tokenizer record (kind {record.get('kind')!r}); expected 'char' or 'bpe'")
    if len(tokens) != vocab_size:
        raise ValueError(f"the tokenizer has {len(tokens)} tokens, the model's vocabulary {vocab_size}")


def scaling_problem(cfg) -> str | None:
    """Why `cfg`'s RoPE scaling cannot be written as llama.cpp metadata, or None."""
    p = cfg.rope_scaling or {}
    kind = p.get("rope_type")
    if kind in (None, "linear", "ntk"):
        return None
    if kind == "yarn":
        own, plain = yarn_attention_factor(p, p["factor"]), yarn_attention_factor({}, p["factor"])
        if abs(own - plain) <= 1e-6 * plain:
            return None
        return ("a YaRN attention factor of its own (--yarn-attn-factor, or mscale) has no one meaning in "
                "llama.cpp's GGUF keys; export it with --format hf, or leave the flag out")
    return (f"RoPE scaling {kind} has no GGUF metadata llamablock writes (llama.cpp stores llama3 as a rope_freqs "
            "tensor and has no dynamic NTK); export it with --format hf")


def _add_rope(w, cfg) -> None:
    """The RoPE base and scaling keys (the module docstring's table)."""
    import gguf

    p = cfg.rope_scaling or {}
    kind = p.get("rope_type")
    w.add_rope_freq_base(float(ntk_base(cfg.rope_theta, p["factor"], cfg.rotary_dim) if kind == "ntk"
                               else cfg.rope_theta))
    if kind == "linear":
        w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        w.add_rope_scaling_factor(float(p["factor"]))
        if p.get("original_max_position_embeddings"):
            w.add_rope_scaling_orig_ctx_len(int(p["original_max_position_embeddings"]))
    elif kind == "yarn":
        w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        w.add_rope_scaling_factor(float(p["factor"]))
        w.add_rope_scaling_orig_ctx_len(int(p.get("original_max_position_embeddings") or cfg.max_seq_len))
        if p.get("beta_fast") is not None:
            w.add_rope_scaling_yarn_beta_fast(float(p["beta_fast"]))
        if p.get("beta_slow") is not None:
            w.add_rope_scaling_yarn_beta_slow(float(p["beta_slow"]))


def export_gguf(model: Decoder, record: dict, out: str | Path) -> Path:
    """Write `model` (a llama-architecture config) and its tokenizer record as one float32 GGUF file."""
    import gguf

    cfg, out = model.cfg, Path(out)
    llama = (cfg.position == "rope" and cfg.norm == "rmsnorm" and cfg.norm_placement == "pre" and cfg.ffn == "swiglu"
             and not (cfg.norm_offset or cfg.embed_scale or cfg.sliding_window))
    if not llama or cfg.qkv_bias or cfg.o_bias or cfg.mlp_bias:  # llamablock.io.export.choose_format says why
        raise ValueError("GGUF export writes llama.cpp's llama architecture (RoPE, pre-LN RMSNorm, SwiGLU, "
                         "no biases); this model is not one")
    if scaling_problem(cfg):
        raise ValueError(scaling_problem(cfg))
    out.parent.mkdir(parents=True, exist_ok=True)

    def write(tmp: Path) -> None:
        w = gguf.GGUFWriter(str(tmp), "llama")
        w.add_name(out.stem)
        w.add_string("llamablock.export", "1")  # ours: a later export may replace this file
        w.add_file_type(gguf.LlamaFileType.ALL_F32)
        w.add_block_count(cfg.n_layers)
        w.add_context_length(cfg.max_seq_len)
        w.add_embedding_length(cfg.d_model)
        w.add_feed_forward_length(cfg.d_ff)
        w.add_head_count(cfg.n_heads)
        w.add_head_count_kv(cfg.n_kv_heads)
        w.add_key_length(cfg.head_dim)
        w.add_value_length(cfg.head_dim)
        w.add_rope_dimension_count(cfg.rotary_dim)
        _add_rope(w, cfg)
        w.add_layer_norm_rms_eps(float(cfg.norm_eps))
        w.add_vocab_size(cfg.vocab_size)
        _add_tokenizer(w, record, cfg.vocab_size)
        for name, arr in _interleaved_state(model).items():
            w.add_tensor(name, arr)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()

    clean_stale(out, EXPORT_MARKER)
    with disk_full(out):
        atomic_write(out, write)
    return out

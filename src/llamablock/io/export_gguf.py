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


def export_gguf(model: Decoder, record: dict, out: str | Path) -> Path:
    """Write `model` (a llama-architecture config) and its tokenizer record as one float32 GGUF file."""
    import gguf

    cfg, out = model.cfg, Path(out)
    llama = (cfg.position == "rope" and cfg.norm == "rmsnorm" and cfg.norm_placement == "pre" and cfg.ffn == "swiglu"
             and not (cfg.norm_offset or cfg.embed_scale or cfg.rope_scaling or cfg.sliding_window))
    if not llama or cfg.qkv_bias or cfg.o_bias or cfg.mlp_bias:  # llamablock.io.export.choose_format says why
        raise ValueError("GGUF export writes llama.cpp's llama architecture (RoPE, pre-LN RMSNorm, SwiGLU, "
                         "no biases); this model is not one")
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
        w.add_rope_freq_base(float(cfg.rope_theta))
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

"""Taking a trained model out of llamablock, and reading llamablock's own folders back in.

Three formats, one folder or file each, written whole into a temporary name and moved into place
(llamablock.util.files.replace_dir / atomic_write), so a reader never sees half an export, and a
kill at any moment leaves the old export or the new one whole:

    "hf"          a transformers directory: config.json, model.safetensors, tokenizer.json,
                  tokenizer_config.json, generation_config.json. For models that a transformers
                  class computes exactly: pre-LN RMSNorm, SwiGLU, RoPE (the 2024 model). The
                  module's small presets rotate neighbouring pairs ("interleaved"); transformers
                  rotates halves, so W_q and W_k rows are permuted once here (rope.permute_qk).
    "gguf"        one llama.cpp file, written with the `gguf` package (io/export_gguf.py).
    "llamablock"  config.json (ModelConfig's own fields, no `model_type`), model.safetensors in
                  llamablock's parameter names, tokenizer.json. For what no transformers class
                  matches, such as the 2017 model (post-LN LayerNorm, learned positions, biases):
                  only llamablock reads it.

RoPE scaling (the checkpoint's own, or `export`'s flags: io/scaling_flags.py export_config and
`with_config`) is written where other runtimes read it: config.json's `rope_parameters`
(transformers 5) and `rope_scaling` with `rope_theta` (v4's keys, which vLLM and llama.cpp's
converter read), `max_position_embeddings` the scaled context; GGUF's keys in io/export_gguf.py.

Tokenizers: training's records ({"kind": "char", "chars"} or {"kind": "bpe", "tokenizer"})
become a `tokenizers` JSON. A character tokenizer is a BPE model with no merges, so every
character is its own token and any tokenizers-based reader (transformers included) splits text
exactly as training did; characters outside the vocabulary are dropped, as such a BPE drops them.
The chat template writes turns in the corpus's own layout ("USER:\nthe text\n\n").

Only llamablock's own outputs are replaced (`export_target`): an export folder carries the marker
file .llamablock-export and a GGUF export the metadata key `llamablock.export`; anything else that
exists at OUT, and any path in or around a training run, is refused by name. A GGUF file written
before the key existed cannot be told from a downloaded one, so it is refused too: remove it.
A checkpoint is exported only when its state.json passes training.state_check and its weights
match their recorded checksum (`llamablock_dir.load_checkpoint(verify=True)`).

Reading these back: llamablock.io.llamablock_dir (a checkpoint or a llamablock directory), the
records (tokenizer, ModelConfig) through llamablock.io.llamablock_records.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import torch
from safetensors.torch import save_file, save_model

from llamablock.config import ModelConfig
from llamablock.io.export_gguf import export_gguf
from llamablock.io.hf_config import config_to_hf
from llamablock.io.llamablock_dir import checkpoint_readers, load_checkpoint
from llamablock.io.llamablock_records import CHAT_TEMPLATE, tokenizer_json
from llamablock.io.resolve import (
    resolve_model,
)
from llamablock.io.tensor_names import hf_name
from llamablock.model import Decoder
from llamablock.rope import permute_qk
from llamablock.util.files import (
    EXPORT_MARKER,
    check_out_path,
    disk_full,
    enclosing_run,
    owned_dir,
    replace_dir,
    staging_dir,
)

EXPORT_FORMATS = ("auto", "hf", "gguf", "llamablock")  # what `export --format` writes
# RoPE scalings a transformers llama computes alike (static "ntk" as default RoPE at its raised base;
# not dynamic NTK: transformers' grows from max_position_embeddings, llamablock's from the original length)
EXPORTED_SCALING = ("linear", "ntk", "yarn", "llama3")


def _write_tokenizer(folder: Path, record: dict, max_len: int, out: Path) -> None:
    conf = {"tokenizer_class": "PreTrainedTokenizerFast", "clean_up_tokenization_spaces": False,
            "add_bos_token": False, "model_max_length": max_len, "chat_template": CHAT_TEMPLATE}
    with disk_full(out / "tokenizer.json"):
        (folder / "tokenizer.json").write_text(json.dumps(tokenizer_json(record), ensure_ascii=False))
        (folder / "tokenizer_config.json").write_text(json.dumps(conf, indent=2))


# Which format ----------------------------------------------------------------------------------
def transformers_family(cfg: ModelConfig) -> tuple[str | None, str | None]:
    """(transformers model_type, None), or (None, why no transformers class computes what cfg computes)."""
    if cfg.position != "rope":
        return None, f"{cfg.position} positions (transformers' llama adds no position vector: it rotates with RoPE)"
    if cfg.norm != "rmsnorm" or cfg.norm_placement != "pre" or cfg.norm_offset or cfg.embed_scale is not None:
        return None, f"{cfg.norm_placement}-LN {cfg.norm} (transformers' llama is pre-LN RMSNorm)"
    if cfg.ffn != "swiglu":
        return None, f"a {cfg.ffn} feed-forward (transformers' llama uses SwiGLU)"
    kind = (cfg.rope_scaling or {}).get("rope_type")
    if kind not in (None, *EXPORTED_SCALING):
        return None, f"RoPE scaling {kind} (exported: {', '.join(EXPORTED_SCALING)})"
    if cfg.sliding_window is not None:
        return None, "a sliding window (not exported)"
    if cfg.qkv_bias == cfg.o_bias:
        return "llama", None  # attention_bias puts biases on q, k, v and o together
    if cfg.qkv_bias and not cfg.mlp_bias:
        return "qwen2", None  # biases on q, k, v only
    return None, "biases on some attention projections but not on the others"


def choose_format(cfg: ModelConfig, fmt: str) -> str:
    """`fmt`, or for "auto" hf where a transformers class matches and llamablock otherwise."""
    if fmt not in EXPORT_FORMATS:
        raise ValueError(f"format must be one of {', '.join(EXPORT_FORMATS)}, got {fmt!r}")
    family, why = transformers_family(cfg)
    if fmt == "auto":
        return "hf" if family else "llamablock"
    if fmt in ("hf", "gguf") and family is None:
        raise ValueError(f"this model cannot be exported as {fmt}: it has {why}, so no transformers or llama.cpp "
                         "architecture computes what it computes; export it as a llamablock directory "
                         "(--format llamablock), which llamablock generate, perplexity and serve read")
    if fmt == "gguf" and family != "llama":
        raise ValueError(f"GGUF export writes the llama architecture; this model is {family}")
    return fmt


# Writers ----------------------------------------------------------------------------------------
def half_layout_state(model: Decoder) -> dict[str, torch.Tensor]:
    """The weights with W_q, W_k (and their biases) in the "half" RoPE layout, a tied head left out."""
    cfg = model.cfg
    out = {}
    for name, t in model.state_dict().items():
        if cfg.tie_embeddings and name == "head.weight":
            continue
        kind = name.split(".")[-2] if name.startswith("layers.") else ""
        if cfg.rope_layout == "interleaved" and kind in ("wq", "wk"):
            heads = cfg.n_heads if kind == "wq" else cfg.n_kv_heads
            t = permute_qk(t, heads, cfg.head_dim, cfg.rotary_dim, to="half")
        out[name] = t.detach().float().cpu().contiguous()
    return out


def _finish(tmp: Path, out: Path, fmt: str) -> None:
    """The marker says the folder is complete and which format; then the folder replaces `out`."""
    with disk_full(out / EXPORT_MARKER):
        (tmp / EXPORT_MARKER).write_text(json.dumps({"written_by": "llamablock export", "format": fmt}) + "\n")
        for f in tmp.iterdir():  # on disk before the rename makes the export visible
            with open(f, "rb") as fh:
                os.fsync(fh.fileno())
    replace_dir(tmp, out, EXPORT_MARKER)


def is_gguf_export(path: Path) -> bool:
    """A GGUF file that llamablock wrote (it carries the metadata key `llamablock.export`)."""
    try:
        with open(path, "rb") as fh:
            if fh.read(4) != b"GGUF":
                return False
        import gguf

        return "llamablock.export" in gguf.GGUFReader(str(path)).fields
    except Exception:  # unreadable or torn: not something we can tell is ours
        return False


def export_target(out: str | Path, fmt: str) -> Path:
    """`out` (absolute) when an export in `fmt` may be written there; ValueError naming it otherwise:
    an existing folder or file llamablock did not write as an export, or a path in or around a run."""
    if fmt != "gguf":
        return owned_dir(out, EXPORT_MARKER, "export")
    p = check_out_path(out)
    run = enclosing_run(p.parent)
    if run is not None:
        raise ValueError(f"OUT {out} is inside the training run or checkpoint {run}; give a path outside it")
    if p.is_symlink() or (p.exists() and not p.is_file()):
        raise ValueError(f"OUT {out} exists and is not a file; a GGUF export is one file: give a new path")
    if p.exists() and not is_gguf_export(p):
        raise ValueError(f"OUT {out} exists and is not a GGUF file llamablock exported (no llamablock.export key); "
                         "llamablock replaces only its own: give a new path, or remove it yourself")
    return p


def export_hf(model: Decoder, record: dict, out: str | Path) -> Path:
    """A transformers directory that AutoModelForCausalLM and AutoTokenizer load."""
    cfg, out = model.cfg, Path(out)
    family = transformers_family(cfg)[0]
    if family is None:
        choose_format(cfg, "hf")  # raises, saying why
    hf = config_to_hf(cfg.replace(family=family, rope_layout="half", extra={}))
    hf.update(dtype="float32", bos_token_id=None, eos_token_id=None, pad_token_id=None,
              rope_theta=hf["rope_parameters"]["rope_theta"])
    if hf["rope_parameters"]["rope_type"] != "default":  # v4's key too, which vLLM and llama.cpp's converter read
        hf["rope_scaling"] = {k: v for k, v in hf["rope_parameters"].items() if k != "rope_theta"}
    tensors = {hf_name(n): t for n, t in half_layout_state(model).items()}
    tmp = staging_dir(out, EXPORT_MARKER)
    try:
        with disk_full(out / "model.safetensors"):
            save_file(tensors, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        with disk_full(out / "config.json"):
            (tmp / "config.json").write_text(json.dumps(hf, indent=2))
            # A character model has no end-of-text token: generation runs to max_new_tokens.
            generation = {"do_sample": False, "max_length": cfg.max_seq_len}
            (tmp / "generation_config.json").write_text(json.dumps(generation, indent=2))
        _write_tokenizer(tmp, record, cfg.max_seq_len, out)
        _finish(tmp, out, "hf")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def export_llamablock(model: Decoder, record: dict, out: str | Path) -> Path:
    """config.json (ModelConfig's fields), model.safetensors (our names), the tokenizer files."""
    out = Path(out)
    tmp = staging_dir(out, EXPORT_MARKER)
    try:
        with disk_full(out / "model.safetensors"):
            save_model(model, str(tmp / "model.safetensors"))  # a tied head stored once
        with disk_full(out / "config.json"):
            (tmp / "config.json").write_text(json.dumps(model.cfg.to_dict(), indent=2))
        _write_tokenizer(tmp, record, model.cfg.max_seq_len, out)
        _finish(tmp, out, "llamablock")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def export_model(model: Decoder, record: dict, out: str | Path, fmt: str = "auto",
                 own: bool = False) -> tuple[str, Path]:
    """Write `model` and its tokenizer record in `fmt`; returns (the format written, the path).
    `out` must be a new path or an earlier export (`export_target`); `own` skips that check for
    the folder a training run writes its own export to (RUN/export, inside the run)."""
    fmt = choose_format(model.cfg, fmt)
    out = Path(out) if own else export_target(out, fmt)
    if fmt == "gguf":
        return fmt, export_gguf(model, record, out)
    return fmt, (export_hf if fmt == "hf" else export_llamablock)(model, record, out)


def with_config(model: Decoder, cfg: ModelConfig) -> Decoder:
    """`model`'s weights in a Decoder of `cfg` (the same shapes; another context or RoPE scaling)."""
    if cfg == model.cfg:
        return model
    new = Decoder(cfg)
    new.load_state_dict(model.state_dict(), strict=True)
    return new.eval()


def export_run(run_dir: str | Path, out: str | Path, fmt: str = "auto", scaling=None) -> tuple[str, Path]:
    """Export the latest complete checkpoint of a training run directory (or one checkpoint folder),
    its weights checksummed first, read while no trainer may delete it (`checkpoint_readers`).
    `scaling`: parsed context and RoPE-scaling flags (io/scaling_flags.py), applied to the config."""
    from llamablock.io.scaling_flags import export_config

    with checkpoint_readers(run_dir):
        model, _, state = load_checkpoint(resolve_model(run_dir), verify=True)
    if scaling is not None:
        model = with_config(model, export_config(model.cfg, scaling))
    return export_model(model, state["tokenizer"], out, fmt)

"""transformers-format checkpoints: config.json + model.safetensors (or sharded with an index).

Our parameter names map to transformers' by io/tensor_names.py's `hf_name`
(`layers.3.attn.wq.weight` is `model.layers.3.self_attn.q_proj.weight`). Phi-3 stores
W_q, W_k, W_v as one qkv_proj and W_gate, W_up as one gate_up_proj: they are split on load into
views of the fused rows (no copy) and fused again on save, so one attention and one feed-forward
serve every family; the fast engine fuses all families' weights the same way (fast/compiled/static_decode.py). Loading is strict both ways: a
tensor the model needs and the file lacks, one the file has and the model does not use, or
one of the wrong shape is an error naming it. Never a silently half-loaded model.
Files are written to a temporary name and renamed, so an interrupted save leaves no torn file.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file

from llamablock.config import ModelConfig
from llamablock.families import FAMILIES
from llamablock.io.empty import empty_decoder
from llamablock.io.hf_config import config_from_hf, config_to_hf
from llamablock.io.resolve import read_json
from llamablock.io.tensor_names import HF_FUSED, HF_LAYER, HF_TOP, hf_name, split_rows
from llamablock.model import Decoder
from llamablock.util.files import atomic_write
from llamablock.util.reads import MAX_JSON, read_bytes_bounded


def split_hf_fused(cfg: ModelConfig, tensors: dict[str, torch.Tensor]) -> None:
    """Phi-3's fused projections replaced, in place, by the separate ones (views of their rows)."""
    ours = {theirs: mine for mine, theirs in HF_LAYER.items()}
    for key in [k for k in tensors if any(f".{f}." in k for f in HF_FUSED)]:
        fused = next(f for f in HF_FUSED if f".{f}." in key)
        pieces = split_rows(tensors.pop(key), tuple(ours[p] for p in HF_FUSED[fused]), cfg, key)
        for part, piece in zip(HF_FUSED[fused], pieces, strict=True):
            tensors[key.replace(fused, part)] = piece


def fuse(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The inverse of split_hf_fused: Phi-3's qkv_proj and gate_up_proj from the separate tensors."""
    out = dict(tensors)
    for fused, parts in HF_FUSED.items():
        for key in [k for k in tensors if f".{parts[0]}." in k]:
            out[key.replace(parts[0], fused)] = torch.cat([out.pop(key.replace(parts[0], p)) for p in parts])
    return out


def _tensor_files(path: Path) -> list[Path]:
    index = path / "model.safetensors.index.json"
    if index.exists():
        try:
            weight_map = json.loads(read_bytes_bounded(index, MAX_JSON, "safetensors index"))["weight_map"]
            names = sorted(set(weight_map.values()))
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            raise ValueError(f"{index} is not a safetensors index (a JSON object with a weight_map): {e}") from None
        root = path.resolve()
        files = []
        for name in names:  # shards stay inside the checkpoint and are regular files (not a FIFO)
            f = (path / str(name)).resolve()
            if root not in f.parents or not f.is_file():
                raise ValueError(f"{index} names shard {name!r}, which is not a file inside {path}")
            files.append(f)
        return files
    single = path / "model.safetensors"
    if single.exists():
        return [single]
    raise FileNotFoundError(f"{path} has neither model.safetensors nor model.safetensors.index.json")


def read_safetensors(path: Path) -> dict[str, torch.Tensor]:
    """Every tensor of the checkpoint's files. A name held by two shards must hold the same values
    in both: which copy a reader takes would otherwise decide what the model computes."""
    tensors: dict[str, torch.Tensor] = {}
    where: dict[str, Path] = {}
    for f in _tensor_files(path):
        try:
            with safe_open(str(f), framework="pt") as fh:
                for k in fh.keys():
                    t = fh.get_tensor(k)
                    if k in tensors and not (t.dtype == tensors[k].dtype and torch.equal(t, tensors[k])):
                        raise ValueError(f"tensor {k!r} is in both {where[k].name} and {f.name} with different "
                                         f"values; remove one copy from the checkpoint")
                    tensors[k], where[k] = t, f
        except (SafetensorError, OSError) as e:
            raise ValueError(f"{f} is not a readable safetensors file (truncated or corrupt?): {e}") from None
    return tensors


def check_sizes(cfg: ModelConfig, tensors: dict[str, torch.Tensor], path: Path) -> None:
    """The config's layer count and embedding shape against the tensors the checkpoint holds,
    before any module exists: a config.json that lies about its size (a million layers) would
    otherwise build modules without bound before a missing tensor could be noticed."""
    layers = {int(m.group(1)) for k in tensors if (m := re.match(r"model\.layers\.(\d+)\.", k))}
    if layers != set(range(cfg.n_layers)):
        raise ValueError(f"{path}/config.json says num_hidden_layers = {cfg.n_layers}, the checkpoint holds "
                         f"{len(layers)} layers")
    embed = tensors.get(HF_TOP["embed.weight"])
    if embed is not None and tuple(embed.shape) != (cfg.vocab_size, cfg.d_model):
        raise ValueError(f"{path}/config.json says vocab_size x hidden_size = {cfg.vocab_size} x {cfg.d_model}, the "
                         f"checkpoint's embedding is {tuple(embed.shape)}")
    for ours, shape in cfg.layer_shapes().items():
        t = tensors.get(hf_name(f"layers.0.{ours}.weight"))
        if t is not None and tuple(t.shape) != shape:
            raise ValueError(f"{path}/config.json implies {shape} for layer 0's {ours}, the checkpoint holds "
                             f"{tuple(t.shape)}: its head counts, head width or widths disagree with the tensors")


def _language_model(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A multimodal Gemma 3 checkpoint's text tensors under the text model's names (the vision
    tower and projector dropped); other checkpoints unchanged."""
    prefixes = ("language_model.model.", "model.language_model.")
    if not any(k.startswith(prefixes) for k in tensors):
        return tensors
    out = {}
    for k, t in tensors.items():
        for p in prefixes:
            if k.startswith(p):
                out["model." + k[len(p):]] = t
        if k in ("language_model.lm_head.weight", "lm_head.weight"):
            out["lm_head.weight"] = t
    return out


def read_hf_config(path: str | Path) -> tuple[ModelConfig, dict]:
    """A transformers directory's config.json: (its ModelConfig, the file's own dict)."""
    cfg_file = Path(path) / "config.json"
    if not cfg_file.exists():
        raise FileNotFoundError(f"{path} has no config.json; expected a transformers checkpoint directory")
    hf = read_json(cfg_file)
    return config_from_hf(hf, cfg_file), hf


def load_hf_dir(path: str | Path, dtype: torch.dtype | None = None, cfg: ModelConfig | None = None) -> Decoder:
    """A Decoder with the directory's safetensors weights in `dtype` (None: as stored); `cfg`: its
    config.json's, when the caller has read it (io/source.py)."""
    path = Path(path)
    cfg = cfg or read_hf_config(path)[0]
    tensors = _language_model(read_safetensors(path))
    if FAMILIES[cfg.family].fused:
        split_hf_fused(cfg, tensors)
    check_sizes(cfg, tensors, path)
    model = empty_decoder(cfg)
    state = {}
    for name, p in model.state_dict(keep_vars=True).items():
        if cfg.tie_embeddings and name == "head.weight":
            continue
        key = hf_name(name, cfg.sandwich_norm)
        if key not in tensors:
            raise ValueError(f"checkpoint {path} lacks tensor {key!r} (needed for {name})")
        t = tensors.pop(key)
        if not t.is_floating_point():  # an int64 or bool norm would be converted silently below
            raise ValueError(f"tensor {key!r} is stored as {t.dtype}; weights must be floating point (float32, "
                             "float16, bfloat16)")
        if tuple(t.shape) != tuple(p.shape):
            raise ValueError(f"tensor {key!r} has shape {tuple(t.shape)}, the config implies {tuple(p.shape)}")
        state[name] = t.to(dtype) if dtype is not None else t
    if cfg.tie_embeddings:
        tensors.pop("lm_head.weight", None)  # some tied checkpoints store the copy anyway
    if tensors:
        raise ValueError(f"checkpoint {path} has tensors the model does not use: {sorted(tensors)[:5]}")
    return model.assign_weights(state)


def save_pretrained(model: Decoder, path: str | Path) -> None:
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    hf_cfg = config_to_hf(model.cfg)
    tensors = {hf_name(n, model.cfg.sandwich_norm): t.detach().contiguous() for n, t in model.state_dict().items()
               if not (model.cfg.tie_embeddings and n == "head.weight")}
    if FAMILIES[model.cfg.family].fused:
        tensors = fuse(tensors)
    atomic_write(path / "model.safetensors", lambda p: save_file(tensors, str(p), metadata={"format": "pt"}))
    atomic_write(path / "config.json", lambda p: p.write_text(json.dumps(hf_cfg, indent=2)))

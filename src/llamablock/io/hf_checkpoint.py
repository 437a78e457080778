"""transformers-format checkpoints: config.json + model.safetensors (or sharded with an index).

Our parameter names are short (`layers.3.attn.wq.weight`); `hf_name` maps them to
transformers' (`model.layers.3.self_attn.q_proj.weight`). Loading is strict both ways: a
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

from llamablock.config import ModelConfig, read_config_json
from llamablock.io.empty import empty_decoder
from llamablock.model import Decoder
from llamablock.util.files import atomic_write

_LAYER = {
    "attn.wq": "self_attn.q_proj", "attn.wk": "self_attn.k_proj", "attn.wv": "self_attn.v_proj",
    "attn.wo": "self_attn.o_proj", "ffn.w_gate": "mlp.gate_proj", "ffn.w_up": "mlp.up_proj",
    "ffn.w_down": "mlp.down_proj", "norm1": "input_layernorm", "norm2": "post_attention_layernorm",
}
_TOP = {"embed.weight": "model.embed_tokens.weight", "final_norm.weight": "model.norm.weight",
        "head.weight": "lm_head.weight"}


def hf_name(name: str) -> str:
    if name in _TOP:
        return _TOP[name]
    m = re.fullmatch(r"layers\.(\d+)\.(\w+\.\w+|norm\d)\.(weight|bias)", name)
    if not m or m.group(2) not in _LAYER:
        raise ValueError(f"parameter {name!r} has no transformers name (only pre-LN RMSNorm families export)")
    return f"model.layers.{m.group(1)}.{_LAYER[m.group(2)]}.{m.group(3)}"


def _tensor_files(path: Path) -> list[Path]:
    index = path / "model.safetensors.index.json"
    if index.exists():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
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
    tensors: dict[str, torch.Tensor] = {}
    for f in _tensor_files(path):
        try:
            with safe_open(str(f), framework="pt") as fh:
                for k in fh.keys():
                    tensors[k] = fh.get_tensor(k)
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
    embed = tensors.get("model.embed_tokens.weight")
    if embed is not None and tuple(embed.shape) != (cfg.vocab_size, cfg.d_model):
        raise ValueError(f"{path}/config.json says vocab_size x hidden_size = {cfg.vocab_size} x {cfg.d_model}, the "
                         f"checkpoint's embedding is {tuple(embed.shape)}")
    for ours, shape in cfg.layer_shapes().items():
        t = tensors.get(hf_name(f"layers.0.{ours}.weight"))
        if t is not None and tuple(t.shape) != shape:
            raise ValueError(f"{path}/config.json implies {shape} for layer 0's {ours}, the checkpoint holds "
                             f"{tuple(t.shape)}: its head counts, head width or widths disagree with the tensors")


def load_hf_dir(path: str | Path, dtype: torch.dtype | None = None) -> Decoder:
    path = Path(path)
    cfg_file = path / "config.json"
    if not cfg_file.exists():
        raise FileNotFoundError(f"{path} has no config.json; expected a transformers checkpoint directory")
    cfg = ModelConfig.from_hf(read_config_json(cfg_file))
    tensors = read_safetensors(path)
    check_sizes(cfg, tensors, path)
    model = empty_decoder(cfg)
    state = {}
    for name, p in model.state_dict(keep_vars=True).items():
        if cfg.tie_embeddings and name == "head.weight":
            continue
        key = hf_name(name)
        if key not in tensors:
            raise ValueError(f"checkpoint {path} lacks tensor {key!r} (needed for {name})")
        t = tensors.pop(key)
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
    hf_cfg = model.cfg.to_hf()
    tensors = {hf_name(n): t.detach().contiguous() for n, t in model.state_dict().items()
               if not (model.cfg.tie_embeddings and n == "head.weight")}
    atomic_write(path / "model.safetensors", lambda p: save_file(tensors, str(p), metadata={"format": "pt"}))
    atomic_write(path / "config.json", lambda p: p.write_text(json.dumps(hf_cfg, indent=2)))

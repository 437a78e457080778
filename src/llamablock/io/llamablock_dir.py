"""Reading llamablock's own folders: a training checkpoint, or a llamablock export (io/export.py
writes it; its config.json holds ModelConfig's fields and no model_type).

A checkpoint's state.json is checked (io/checkpoint_state.py) before any model is built from it.

A run being trained deletes its older checkpoints after each save (training.checkpoint._prune),
so a reader that resolved `checkpoints/latest` could find the folder gone before it had read it
(`export` of a running run: "step-000073/model.safetensors is missing"). `checkpoint_readers`
holds a shared flock on the run's checkpoints/ folder while reading; training deletes only when
`checkpoint_deleter` gets the same lock exclusively at once, and otherwise leaves the old
folders to its next save. Nobody waits on a reader's account: the trainer skips, the reader
waits only for a deletion in progress.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from pathlib import Path

import torch
from safetensors.torch import load_model

from llamablock.config import ModelConfig
from llamablock.io.checkpoint_state import checked_checkpoint, checked_state
from llamablock.io.llamablock_records import model_config, tokenizer_from_record
from llamablock.io.resolve import is_checkpoint, read_json
from llamablock.model import Decoder


def is_llamablock_dir(path: Path) -> bool:
    """A folder of ours: a checkpoint (state.json) or an export whose config.json has no model_type."""
    if is_checkpoint(path):
        return True
    conf = path / "config.json"
    return path.is_dir() and conf.is_file() and "model_type" not in read_json(conf)


def load_safetensors_into(model: Decoder, file: Path, config: str) -> None:
    """`file`'s tensors into `model`; a ValueError naming the file when it is unreadable or its
    tensors do not have the shapes `config` (the file the model was built from) implies."""
    from safetensors import safe_open

    if not file.is_file():
        raise FileNotFoundError(f"{file} is missing: the weights belong beside {config}")
    try:
        with safe_open(str(file), "pt") as f:
            shapes = {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}
    except Exception as e:  # safetensors raises its own error types on a torn file
        raise ValueError(f"{file} is not a readable safetensors file (truncated or corrupt?): {e}") from None
    for name, t in model.state_dict().items():
        if name in shapes and shapes[name] != tuple(t.shape):
            raise ValueError(f"{file} holds {name} as {shapes[name]}, but {config} implies {tuple(t.shape)}: the "
                             "config and the weights are of different models")
    try:
        load_model(model, str(file), strict=True)
    except RuntimeError as e:  # missing or unexpected tensors
        first = " ".join(str(e).split())
        raise ValueError(f"{file} does not hold the tensors {config} implies: {first[:300]}") from None


def read_llamablock_dir(path: Path, tokenizer: bool = True) -> tuple[ModelConfig, object, str]:
    """(config, Tokenizer or None, where the config was read) of a checkpoint folder (its state.json,
    checked) or a llamablock export (its config.json): all but the weights."""
    from llamablock.io.tokenizer import tokenizer_from_dir

    path = Path(path)
    if is_checkpoint(path):
        return _state_parts(path, checked_state(path, need_sums=False), tokenizer)
    conf = path / "config.json"
    cfg = model_config(read_json(conf), str(conf))
    return cfg, (tokenizer_from_dir(path) if tokenizer else None), str(conf)


def load_llamablock_weights(path: Path, cfg: ModelConfig, where: str, dtype: torch.dtype | None = None) -> Decoder:
    """The Decoder of `cfg` (read from `where`) with the folder's model.safetensors, in eval mode."""
    model = Decoder(cfg)
    load_safetensors_into(model, Path(path) / "model.safetensors", where)
    return (model.to(dtype) if dtype is not None else model).eval()


def load_checkpoint(path: Path, verify: bool = False) -> tuple[Decoder, object, dict]:
    """(model in eval mode, Tokenizer, state) of one training checkpoint folder. Its state.json is
    checked (typed, shapes bounded by the weights' headers) before any model is built; with
    `verify` it must record checksums and the weights must match theirs (export does; a resume
    checks both tensor files, training.checkpoint.verify). Without, checksums may be absent:
    generate and serve read a run whose state.json records none."""
    state = checked_checkpoint(path, ("model.safetensors",)) if verify else checked_state(path, need_sums=False)
    cfg, tok, where = _state_parts(Path(path), state, tokenizer=True)
    return load_llamablock_weights(path, cfg, where), tok, state


def _state_parts(path: Path, state: dict, tokenizer: bool) -> tuple[ModelConfig, object, str]:
    """(config, Tokenizer or None, where the config was read) from a checkpoint's checked state.json,
    each refusal naming the file and the field."""
    where = path / "state.json"
    cfg = model_config(state.get("model_config"), f"{where}: model_config")
    try:
        tok = tokenizer_from_record(state.get("tokenizer")) if tokenizer else None
    except ValueError as e:
        raise ValueError(f"{where}: tokenizer: {e}") from None
    return cfg, tok, f"{where}'s model_config"


def load_llamablock_dir(path: Path, dtype: torch.dtype | None = None):
    """(Decoder, Tokenizer) of a checkpoint folder or a llamablock export."""
    cfg, tok, where = read_llamablock_dir(Path(path))
    return load_llamablock_weights(path, cfg, where, dtype), tok


def _checkpoints_root(path: Path) -> Path | None:
    """The checkpoints/ folder of a run directory, or of the run a checkpoint folder belongs to."""
    path = Path(path)
    if (path / "checkpoints").is_dir():
        return path / "checkpoints"
    if path.parent.name == "checkpoints" and path.is_dir():
        return path.parent
    return None


@contextlib.contextmanager
def _folder_lock(root: Path | None, mode: int):
    """flock(`mode`) on the folder `root` itself for the block (a folder's inode stays while the
    files in it are replaced; no lock file is written, so a read-only run is read the same way);
    yields whether it is held."""
    fd = None
    if root is not None:
        with contextlib.suppress(OSError):
            fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        held = fd is not None
        if held:
            try:
                fcntl.flock(fd, mode)
            except BlockingIOError:
                held = False
        yield held
    finally:
        if fd is not None:
            os.close(fd)


def checkpoint_readers(path: str | Path):
    """Hold the shared lock of the run that `path` (a run directory or one of its checkpoint
    folders) belongs to, for a block that reads its checkpoints (a context manager)."""
    return _folder_lock(_checkpoints_root(Path(path)), fcntl.LOCK_SH)


def checkpoint_deleter(root: str | Path):
    """The exclusive lock of a run's checkpoints/ folder `root`, if no reader holds it now: the
    context manager yields whether it is held (only then may checkpoints be deleted)."""
    return _folder_lock(Path(root), fcntl.LOCK_EX | fcntl.LOCK_NB)

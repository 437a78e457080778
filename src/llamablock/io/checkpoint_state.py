"""Checking a checkpoint's state.json before anything trusts it: typed fields, confined paths,
shapes that the weights on disk bear out, checksums that match.

A state.json is read by resume, export, generate and serve, and can have been edited, truncated
or written by someone else. `checked_state` refuses, with a ValueError naming the file and the
field, anything that would make a reader open a file outside the checkpoint folder, trust weights
nobody checksummed, or build a model larger than the weights it claims to describe (the shapes are
compared on torch's "meta" device, which allocates nothing, after the layer count is bounded by
the tensors present). `checked_checkpoint` adds the checksums: bytes that differ from those
recorded at save time are refused.
"""

from __future__ import annotations

import hashlib
import math
import re
from pathlib import Path

TENSOR_FILES = ("model.safetensors", "optimizer.safetensors")
_HEX = re.compile(r"[0-9a-f]{64}")
_STEP_DIR = re.compile(r"step-(\d+)")


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _finite_number(v) -> bool:
    return (_is_int(v) or isinstance(v, float)) and math.isfinite(v)


def _check_sums(sums) -> None:
    if sums is None:
        raise ValueError("sha256 is missing: this checkpoint has no checksums, so nothing shows its weights are the "
                         "ones saved; llamablock refuses it (resume an older checkpoint, or train again)")
    if not isinstance(sums, dict):
        raise ValueError(f"sha256 must be an object of file name -> hex digest, got {type(sums).__name__}")
    if set(sums) != set(TENSOR_FILES):
        odd = sorted(map(str, set(sums) ^ set(TENSOR_FILES)))[:3]
        raise ValueError(f"sha256 must name exactly {', '.join(TENSOR_FILES)} (files in the checkpoint folder "
                         f"itself), not {', '.join(repr(o[:60]) for o in odd)}")
    bad = next((k for k, v in sums.items() if not (isinstance(v, str) and _HEX.fullmatch(v))), None)
    if bad is not None:
        raise ValueError(f"sha256[{bad!r}] is not a sha256 hex digest")


def _check_history(history, step: int) -> None:
    if not isinstance(history, list):
        raise ValueError("history must be a list of records")
    for i, r in enumerate(history):
        if not isinstance(r, dict) or not all(_finite_number(r.get(k)) for k in ("step", "train_loss", "lr")):
            raise ValueError(f"history[{i}] is not a record of finite step, train_loss and lr")
        if not all(_finite_number(v) for v in r.values()):
            raise ValueError(f"history[{i}] holds a value that is not a finite number")
        if not _is_int(r["step"]) or not 0 < r["step"] <= step:
            raise ValueError(f"history[{i}].step must be a whole number from 1 to the checkpoint's step {step}")


def _file_shapes(file: Path) -> dict[str, tuple]:
    from safetensors import safe_open

    if not file.is_file():
        raise ValueError(f"{file.name} is missing")
    try:
        with safe_open(str(file), "pt") as f:
            return {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}
    except Exception as e:  # safetensors raises its own error types on a torn file
        raise ValueError(f"{file.name} is not a readable safetensors file (truncated or corrupt?): {e}") from None


def _check_shapes(cfg, file: Path) -> None:
    """The model `cfg` describes has exactly the tensors in `file`: built on the meta device (no
    memory), after n_layers is bounded by the layers the file holds, so no claim can allocate."""
    import torch

    from llamablock.model import Decoder

    shapes = _file_shapes(file)
    layers = {k.split(".")[1] for k in shapes if k.startswith("layers.")}
    if cfg.n_layers != len(layers):
        raise ValueError(f"model_config.n_layers is {cfg.n_layers}, but {file.name} holds {len(layers)} layers")
    with torch.device("meta"):
        want = {k: tuple(t.shape) for k, t in Decoder(cfg).state_dict().items()}
    if cfg.tie_embeddings:  # save_model stores the shared tensor once, under either name
        for k in ("head.weight", "embed.weight"):
            if k not in shapes:
                want.pop(k, None)
    wrong = next((k for k in sorted(set(want) | set(shapes)) if want.get(k) != shapes.get(k)), None)
    if wrong is not None:
        raise ValueError(f"model_config implies {wrong} as {want.get(wrong)}, but {file.name} holds "
                         f"{shapes.get(wrong)}: the config and the weights are of different models")


def checked_state(path: str | Path, need_sums: bool = True, check_train=None) -> dict:
    """state.json of the checkpoint folder `path`, every field typed and bounded; ValueError naming
    state.json and the field otherwise. Reads the tensor files' headers, not their data. Without
    `need_sums` a missing checksum table is let through (one that is there is still checked).
    `check_train(train_config)` raises ValueError for training settings a resume cannot use
    (training.state_check passes TrainConfig's check; readers of the weights alone need none)."""
    from llamablock.io.llamablock_records import model_config, tokenizer_from_record
    from llamablock.io.resolve import read_state

    path = Path(path)
    where = path / "state.json"
    state = read_state(path)
    try:
        step = state.get("step")
        if not _is_int(step) or step < 0:
            raise ValueError(f"step must be a whole number >= 0, got {str(step)[:40]}")
        m = _STEP_DIR.fullmatch(path.name)
        if m and int(m.group(1)) != step:
            raise ValueError(f"step is {step}, but the folder is {path.name}")
        if need_sums or state.get("sha256") is not None:
            _check_sums(state.get("sha256"))
        for k, kind in (("model_config", dict), ("train_config", dict), ("tokenizer", dict), ("optimizer", dict)):
            if not isinstance(state.get(k), kind):
                raise ValueError(f"{k} is missing or not a JSON object")
        cfg = model_config(state["model_config"], "model_config")
        if check_train is not None:
            check_train(state["train_config"])
        try:
            tokenizer_from_record(state["tokenizer"])  # parsed, as a resume will: a garbled one is damage
        except ValueError as e:
            raise ValueError(f"tokenizer: the run's tokenizer record is damaged: {e}") from None
        _check_history(state.get("history"), step)
        groups = state["optimizer"].get("param_groups")
        if not isinstance(groups, list) or not all(isinstance(g, dict) and isinstance(g.get("params"), list)
                                                   for g in groups):
            raise ValueError("optimizer.param_groups is not a list of AdamW's parameter groups")
        _check_shapes(cfg, path / "model.safetensors")
    except ValueError as e:
        raise ValueError(f"{where}: {e}") from None
    return state


def checked_checkpoint(path: str | Path, files: tuple[str, ...] = TENSOR_FILES, check_train=None) -> dict:
    """`checked_state`, and each of `files` matches the checksum recorded when it was saved."""
    path = Path(path)
    state = checked_state(path, check_train=check_train)
    for f in files:
        if not (path / f).is_file():
            raise ValueError(f"{path / f} is missing")
        if sha256(path / f) != state["sha256"][f]:
            raise ValueError(f"{path / f} does not match the checksum recorded when it was saved (damaged, truncated "
                             "or edited)")
    return state

"""Training checkpoints: weights and optimizer moments as safetensors, the rest as JSON.

Layout of a run directory:

    checkpoints/step-000015/model.safetensors      weights (a tied head stored once)
    checkpoints/step-000015/optimizer.safetensors  AdamW's exp_avg, exp_avg_sq, step per parameter
    checkpoints/step-000015/state.json             model config, train config, step, optimizer
                                                   param groups, tokenizer, history
    checkpoints/latest                             the name of the newest complete checkpoint

Atomicity: a checkpoint is written into a hidden temporary folder and renamed into place
(os.replace), then `latest` is rewritten the same way (write a temporary file, rename). A writer
killed at any point leaves `latest` naming the previous complete checkpoint, so it stays loadable;
the half-written folder is ignored and removed by the next save. Old checkpoints are deleted
only while no reader holds the run's readers lock (io/llamablock_dir.py checkpoint_readers: an
export reading the run meanwhile), else at a later save.
Trust: state.json records the sha256 of both tensor files; `verify` (before a resume) refuses a
checkpoint without them, with a mistyped or unbounded state.json (training.state_check) or with
bytes that differ, and the resume falls back to the newest checkpoint that passes.
Reading the layout (`latest_checkpoint`, `read_state`) lives in llamablock.io.resolve, beneath
training, so that the loaders of io/ (generate, serve, export) can take a run directory too.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file, save_model

from llamablock.io.llamablock_dir import checkpoint_deleter
from llamablock.io.resolve import latest_checkpoint, read_state  # noqa: F401 (the run layout's reader)
from llamablock.training.state_check import TENSOR_FILES, checked_checkpoint
from llamablock.training.state_check import sha256 as _sha256
from llamablock.util.files import atomic_write, disk_full, replace_dir
from llamablock.util.finite import all_finite
from llamablock.util.reads import kind_of

KEEP = 2  # complete checkpoints kept on disk


def _dir(run_dir: Path) -> Path:
    return Path(run_dir) / "checkpoints"


def _optimizer_tensors(opt: torch.optim.Optimizer) -> tuple[dict[str, torch.Tensor], dict]:
    sd = opt.state_dict()
    tensors = {f"{i}.{k}": v.detach().clone().contiguous()
               for i, st in sd["state"].items() for k, v in st.items() if torch.is_tensor(v)}
    return tensors, {"param_groups": sd["param_groups"]}


def save_checkpoint(run_dir: str | Path, step: int, model: torch.nn.Module, opt: torch.optim.Optimizer,
                    state: dict) -> Path:
    root = _dir(run_dir)
    root.mkdir(parents=True, exist_ok=True)
    name = f"step-{step:06d}"
    tmp = root / f".tmp-{name}-{os.getpid()}"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    final = root / name
    try:
        with disk_full(final / "model.safetensors"):
            save_model(model, str(tmp / "model.safetensors"))
        tensors, meta = _optimizer_tensors(opt)
        with disk_full(final / "optimizer.safetensors"):
            save_file(tensors, str(tmp / "optimizer.safetensors"))
        sums = {f: _sha256(tmp / f) for f in TENSOR_FILES}  # checked at resume (`verify`)
        with disk_full(final / "state.json"):
            (tmp / "state.json").write_text(json.dumps({**state, "step": step, "optimizer": meta, "sha256": sums},
                                                       indent=1, allow_nan=False))
            for f in (*TENSOR_FILES, "state.json"):  # on disk before the rename makes the checkpoint visible
                with open(tmp / f, "rb") as fh:
                    os.fsync(fh.fileno())
    except BaseException:  # a full disk, an interrupt: no half-written folder is left behind
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    replace_dir(tmp, final)
    with disk_full(root / "latest"):
        atomic_write(root / "latest", lambda p: p.write_text(name))
    _prune(root, keep=name)
    return final


@contextlib.contextmanager
def run_lock(run_dir: str | Path):
    """Hold `run_dir/.lock` (flock) while training writes there: a second trainer on the same
    directory is refused instead of interleaving its checkpoints with the first's."""
    path = Path(run_dir) / ".lock"
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.exists() and not path.is_file():  # opening a FIFO there for writing waited for a reader for ever
        raise ValueError(f"{path} is {kind_of(path.stat().st_mode)}, not the run's lock file; remove it")
    try:  # O_NONBLOCK: should one appear between the check and the open, it fails instead of waiting
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_NONBLOCK, 0o644)
    except OSError as e:
        raise ValueError(f"{path} cannot be opened as the run's lock file ({e.strerror}); remove it") from None
    with os.fdopen(fd, "w") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise ValueError(f"another llamablock train is writing to {run_dir}; wait for it to end or choose "
                             "another --out") from None
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def verify(path: str | Path) -> str | None:
    """Why the checkpoint folder `path` cannot be trusted, or None: a state.json that
    state_check.checked_state refuses (mistyped, unbounded, no checksums), a tensor file whose
    bytes differ from the checksums recorded when it was saved, non-finite weights or moments."""
    path = Path(path)
    try:
        checked_checkpoint(path)
    except (OSError, ValueError) as e:
        return str(e)
    for f in TENSOR_FILES:
        try:
            tensors = load_file(str(path / f))
        except Exception as e:  # safetensors raises its own error types on torn files
            return f"{f} is unreadable ({type(e).__name__}: {e})"
        bad = next((k for k, t in tensors.items() if t.is_floating_point() and not all_finite(t)), None)
        if bad is not None:
            return f"{f} holds non-finite values ({bad})"
    return None


def newest_good_checkpoint(run_dir: str | Path, warn=None) -> Path:
    """The newest checkpoint of a run that `verify` trusts; each newer one it skips is reported
    through `warn` (a message). FileNotFoundError naming the reasons when none is good."""
    latest = latest_checkpoint(run_dir)
    candidates = [latest] + sorted((p for p in _dir(run_dir).glob("step-*") if p.is_dir() and p != latest), reverse=True)
    reasons = []
    for path in candidates:
        why = verify(path)
        if why is None:
            if reasons and warn is not None:
                warn(f"resuming from {path.name} instead: " + "; ".join(reasons))
            return path
        reasons.append(f"{path.name}: {why}")
    raise FileNotFoundError(f"no usable checkpoint in {run_dir}: " + "; ".join(reasons)
                            + "; start a new run with another --out")


def _prune(root: Path, keep: str) -> None:
    """Drop leftovers of killed writers and all but the newest KEEP checkpoints; the checkpoints
    only while no reader (an export) holds the run's readers lock, else at a later save."""
    for p in root.glob(".tmp-*"):
        if not p.name.endswith(f"-{os.getpid()}"):
            shutil.rmtree(p, ignore_errors=True)
    with checkpoint_deleter(root) as free:
        if not free:
            return
        steps = sorted(p for p in root.glob("step-*") if p.is_dir())
        for p in steps[:-KEEP]:
            if p.name != keep:  # `keep`, the checkpoint just written and checksummed, always stays
                shutil.rmtree(p, ignore_errors=True)


def load_weights(path: str | Path, model: torch.nn.Module) -> None:
    """The checkpoint's weights into `model`: a ValueError naming the file on missing, extra or
    misshapen tensors (a state.json whose model_config was edited)."""
    from llamablock.io.llamablock_dir import load_safetensors_into as load_checked

    load_checked(model, Path(path) / "model.safetensors", f"{Path(path) / 'state.json'}'s model_config")


def load_optimizer(path: str | Path, opt: torch.optim.Optimizer, state: dict) -> None:
    try:
        tensors = load_file(str(Path(path) / "optimizer.safetensors"))
        per_param: dict[int, dict] = {}
        for key, value in tensors.items():
            i, name = key.split(".", 1)
            per_param.setdefault(int(i), {})[name] = value
        opt.load_state_dict({"state": per_param, "param_groups": state["optimizer"]["param_groups"]})
    except (ValueError, KeyError, TypeError) as e:  # groups or moments that are not this model's
        raise ValueError(f"{Path(path) / 'optimizer.safetensors'} and the optimizer of state.json do not fit this "
                         f"model ({type(e).__name__}: {e}); start a new run with another --out") from None

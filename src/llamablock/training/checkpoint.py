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
the half-written folder is ignored and removed by the next save.
Reading the layout (`latest_checkpoint`, `read_state`) lives in llamablock.io.resolve, beneath
training, so that the loaders of io/ (generate, serve, export) can take a run directory too.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file, load_model, save_file, save_model

from llamablock.io.resolve import latest_checkpoint, read_state  # noqa: F401 (the run layout's reader)
from llamablock.util.files import atomic_write, replace_dir

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
    save_model(model, str(tmp / "model.safetensors"))
    tensors, meta = _optimizer_tensors(opt)
    save_file(tensors, str(tmp / "optimizer.safetensors"))
    (tmp / "state.json").write_text(json.dumps({**state, "step": step, "optimizer": meta}, indent=1))
    final = root / name
    replace_dir(tmp, final)
    atomic_write(root / "latest", lambda p: p.write_text(name))
    _prune(root, keep=name)
    return final


def _prune(root: Path, keep: str) -> None:
    """Drop leftovers of killed writers and all but the newest KEEP checkpoints."""
    for p in root.glob(".tmp-*"):
        if not p.name.endswith(f"-{os.getpid()}"):
            shutil.rmtree(p, ignore_errors=True)
    steps = sorted(p for p in root.glob("step-*") if p.is_dir())
    for p in steps[:-KEEP]:
        if p.name != keep:
            shutil.rmtree(p, ignore_errors=True)


def load_weights(path: str | Path, model: torch.nn.Module) -> None:
    load_model(model, str(Path(path) / "model.safetensors"), strict=True)  # raises on missing or extra tensors


def load_optimizer(path: str | Path, opt: torch.optim.Optimizer, state: dict) -> None:
    tensors = load_file(str(Path(path) / "optimizer.safetensors"))
    per_param: dict[int, dict] = {}
    for key, value in tensors.items():
        i, name = key.split(".", 1)
        per_param.setdefault(int(i), {})[name] = value
    opt.load_state_dict({"state": per_param, "param_groups": state["optimizer"]["param_groups"]})

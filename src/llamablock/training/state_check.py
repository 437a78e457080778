"""A checkpoint's state.json checked for a resume: io.checkpoint_state's checks (typed fields,
confined paths, shapes borne out by the weights, checksums), plus the training settings that a
resume rebuilds (TrainConfig), which readers of the weights alone (export, generate) do not need.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from llamablock.io.checkpoint_state import TENSOR_FILES, sha256
from llamablock.io.checkpoint_state import checked_checkpoint as _checked_checkpoint
from llamablock.io.checkpoint_state import checked_state as _checked_state

__all__ = ["TENSOR_FILES", "checked_checkpoint", "checked_state", "sha256"]


def _train_config(d: dict) -> None:
    from llamablock.training.recipe import TrainConfig

    unknown = sorted(set(d) - {f.name for f in dataclasses.fields(TrainConfig)})
    if unknown:
        raise ValueError(f"train_config has unknown field(s) {unknown}")
    try:
        TrainConfig(**d)
    except (TypeError, ValueError) as e:
        raise ValueError(f"train_config: {e}") from None


def checked_state(path: str | Path, need_sums: bool = True) -> dict:
    """io.checkpoint_state.checked_state with the training settings checked too."""
    return _checked_state(path, need_sums, check_train=_train_config)


def checked_checkpoint(path: str | Path, files: tuple[str, ...] = TENSOR_FILES) -> dict:
    """io.checkpoint_state.checked_checkpoint with the training settings checked too."""
    return _checked_checkpoint(path, files, check_train=_train_config)

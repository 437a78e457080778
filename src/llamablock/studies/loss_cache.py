"""Per-token losses kept on disk, so that re-running or re-plotting an evaluation computes nothing twice.

An entry is the float32 losses of one (model file, token ids, method and its settings, length);
its name is the SHA-256 of those. The model file is named by its resolved path, size and
modification time (every file's, for a directory): a checkpoint rewritten in place gets new
entries, and nothing has to read gigabytes to hash them. The ids are hashed whole, so a changed
text or tokenizer is a new entry. Entries are written atomically (util.files.atomic_write) and
checked for their length when read; a damaged one is recomputed.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import numpy as np
import torch

from llamablock.util.files import atomic_write, user_cache_dir

VERSION = 1  # bump when the losses a key names would be computed differently


def default_cache_dir() -> Path:
    return user_cache_dir() / "rope-eval"


def model_identity(path: str | Path) -> str:
    """Resolved path, size and mtime of a model file, or of every file in a model directory."""
    p = Path(path).resolve()
    files = sorted(f for f in p.rglob("*") if f.is_file()) if p.is_dir() else [p]
    return json.dumps([[str(f), f.stat().st_size, f.stat().st_mtime_ns] for f in files])


class LossCache:
    """`get(key)` -> losses or None; `put(key, losses)`. A None directory keeps nothing."""

    def __init__(self, directory: str | Path | None):
        self.dir = Path(directory) if directory is not None else None
        self.hits = self.misses = 0

    @staticmethod
    def key(model: str, ids: torch.Tensor, method: str, settings: dict, tokens: int, dtype: str) -> str:
        ids_digest = hashlib.sha256(ids.to(torch.int64).cpu().numpy().tobytes()).hexdigest()
        fields = dict(version=VERSION, model=model, ids=ids_digest, method=method, settings=settings,
                      tokens=tokens, dtype=dtype)
        return hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()

    def _path(self, key: str) -> Path:
        return self.dir / f"{key}.f32"

    def get(self, key: str, n: int) -> torch.Tensor | None:
        if self.dir is None or not self._path(key).is_file():
            self.misses += 1
            return None
        data = self._path(key).read_bytes()
        if len(data) != 4 * n:  # damaged or foreign: computed again
            self.misses += 1
            return None
        self.hits += 1
        return torch.from_numpy(np.frombuffer(data, dtype=np.float32).copy())

    def put(self, key: str, losses: torch.Tensor) -> None:
        if self.dir is None:
            return
        os.makedirs(self.dir, exist_ok=True)
        data = losses.detach().to(torch.float32).cpu().numpy().tobytes()
        atomic_write(self._path(key), lambda p: Path(p).write_bytes(data))

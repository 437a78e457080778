"""Per-token losses kept on disk, so that re-running or re-plotting an evaluation computes nothing twice.

An entry is the float32 losses of one (model file, token ids, method and its settings, length);
its name is the SHA-256 of those. The model file is named by its resolved path, size and
modification time (every file's, for a directory): a checkpoint rewritten in place gets new
entries, and nothing has to read gigabytes to hash them. The ids are hashed whole, so a changed
text or tokenizer is a new entry.

The cache is never trusted: a file of the right length can hold the wrong numbers (a disk error,
an edit, another entry copied over it), and those would give a wrong perplexity in silence. So
each entry carries, in a one-line header before its losses, its own name (another entry copied or
renamed over it is not it), the SHA-256 of the ids it was computed on and of its losses; an entry whose header, length, digests or values (NaN, infinite) are not
what they should be is ignored with one line on stderr and computed again. Entries are written
atomically (util.files.atomic_write). A cache that cannot be written (read-only, full, not a
folder) is still read; what is computed is then kept for this run only, said in one line.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import sys
from pathlib import Path

import numpy as np
import torch

from llamablock.util.files import atomic_write, is_disk_full, user_cache_dir

VERSION = 2  # bump when the losses a key names would be computed differently, or entries are written so
MAGIC = b"llamablock losses 2 "  # then the header's JSON: {"key", "n": losses, "tokens": sha256, "losses": sha256}
UNWRITABLE = (errno.EROFS, errno.EACCES, errno.EPERM, errno.ENOTDIR, errno.EEXIST)


def default_cache_dir() -> Path:
    return user_cache_dir() / "rope-eval"


def model_identity(path: str | Path) -> str:
    """Resolved path, size and mtime of a model file, or of every file in a model directory."""
    p = Path(path).resolve()
    files = sorted(f for f in p.rglob("*") if f.is_file()) if p.is_dir() else [p]
    return json.dumps([[str(f), f.stat().st_size, f.stat().st_mtime_ns] for f in files])


def tokens_digest(ids: torch.Tensor) -> str:
    """The SHA-256 of token ids, as int64: what an entry says it was computed on."""
    return hashlib.sha256(ids.to(torch.int64).cpu().numpy().tobytes()).hexdigest()


def _say(line: str) -> None:
    print(f"llamablock: {line}", file=sys.stderr, flush=True)


class LossCache:
    """`get(key, n, ids)` -> losses or None; `put(key, losses, ids)`. A None directory keeps nothing."""

    def __init__(self, directory: str | Path | None):
        self.dir = Path(directory) if directory is not None else None
        self.hits = self.misses = 0
        self.writable = self.dir is not None

    @staticmethod
    def key(model: str, ids: torch.Tensor, method: str, settings: dict, tokens: int, dtype: str) -> str:
        fields = dict(version=VERSION, model=model, ids=tokens_digest(ids), method=method, settings=settings,
                      tokens=tokens, dtype=dtype)
        return hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()

    def path(self, key: str) -> Path:
        return self.dir / f"{key}.losses"

    def get(self, key: str, n: int, ids: torch.Tensor) -> torch.Tensor | None:
        """The `n` losses kept under `key` for the tokens `ids`, or None (absent, or damaged: said in one line)."""
        path = None if self.dir is None else self.path(key)
        try:
            data = path.read_bytes() if path is not None else None
        except (FileNotFoundError, NotADirectoryError):  # absent (the folder under a file: not writable either)
            data = None
        except OSError as e:
            _say(f"the loss-cache entry {path} cannot be read ({e.strerror}): computing it again")
            data = None
        if data is None:
            self.misses += 1
            return None
        losses, why = _parse(data, key, n, tokens_digest(ids))
        if why is not None:
            _say(f"the loss-cache entry {path} is damaged ({why}): ignoring it and computing it again")
            self.misses += 1
            return None
        self.hits += 1
        return losses

    def put(self, key: str, losses: torch.Tensor, ids: torch.Tensor) -> None:
        """Keep `losses` (computed on `ids`) under `key`; where the cache cannot be written, one line
        and nothing more is kept this run."""
        if not self.writable:
            return
        data = losses.detach().to(torch.float32).cpu().numpy().tobytes()
        header = {"key": key, "n": len(data) // 4, "tokens": tokens_digest(ids), "losses": hashlib.sha256(data).hexdigest()}
        entry = MAGIC + json.dumps(header, sort_keys=True).encode() + b"\n" + data
        try:
            os.makedirs(self.dir, exist_ok=True)
            atomic_write(self.path(key), lambda p: Path(p).write_bytes(entry))
        except OSError as e:
            if e.errno not in UNWRITABLE and not is_disk_full(e):
                raise
            self.writable = False
            _say(f"the loss cache {self.dir} cannot be written ({e.strerror or e}): computing without caching")


def _parse(data: bytes, key: str, n: int, tokens: str) -> tuple[torch.Tensor | None, str | None]:
    """(losses, None) for the entry named `key` that holds `n` finite losses computed on `tokens` (a
    digest) and agrees with its own digest; else (None, what is wrong)."""
    head, sep, body = data.partition(b"\n")
    if not head.startswith(MAGIC) or not sep:
        return None, "no header"
    try:
        header = json.loads(head[len(MAGIC):])
        want_key, want_n, want_tokens, want_losses = header["key"], header["n"], header["tokens"], header["losses"]
    except (ValueError, KeyError, TypeError):
        return None, "its header cannot be read"
    if want_key != key:
        return None, "it is another entry's (copied or renamed)"
    if want_tokens != tokens:
        return None, "computed on other tokens"
    if want_n != n or len(body) != 4 * n:
        return None, f"{len(body) // 4} losses where {n} belong"
    if hashlib.sha256(body).hexdigest() != want_losses:
        return None, "its losses differ from their digest"
    losses = torch.from_numpy(np.frombuffer(body, dtype=np.float32).copy())
    if not torch.isfinite(losses).all():
        return None, "it holds NaN or infinite losses"
    return losses, None

"""Files that are never half written, and where llamablock keeps what it caches.

Every file llamablock writes goes through `atomic_write` (a temporary name in the same folder,
flushed to disk, then renamed over the target) and every folder through `replace_dir`: a reader,
or a run killed half way, sees the old version or the new one, never a mix (POSIX rename is
atomic within one file system, which is why the temporary sits beside the target).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Callable


def atomic_write(path: str | Path, write: Callable[[Path], object]) -> None:
    """Call write(tmp_path), flush it to disk, then rename it over `path`."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        write(tmp)
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


def replace_dir(tmp: str | Path, final: str | Path) -> None:
    """Move the finished folder `tmp` to `final`, replacing what is there (the rename is atomic;
    an older `final` is removed first, so a reader may briefly find none, never a partial one)."""
    final = Path(final)
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)


def user_cache_dir() -> Path:
    """llamablock's cache root, $XDG_CACHE_HOME/llamablock (default ~/.cache/llamablock): compiled
    programs, inductor's caches, the tracer's trained models."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "llamablock"

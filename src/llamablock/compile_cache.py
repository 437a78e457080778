"""Where torch.compile keeps what it built, so that a second run does not compile again.

inductor caches compiled graphs (its FX graph cache), AOTAutograd's traced graphs and
max-autotune's kernel choices on disk, keyed by the graph, the inputs' shapes and the torch
version. By default that directory is under /tmp (`torchinductor_<user>`), which many systems
empty at boot; `use_persistent_cache` points it at the user's cache directory instead:

    $XDG_CACHE_HOME/llamablock/inductor   (default ~/.cache/llamablock/inductor)

It must run before torch._inductor reads its configuration (the command line calls it at
start-up). A TORCHINDUCTOR_CACHE_DIR the user set wins. `--no-compile` avoids the cache entirely.
"""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "llamablock" / "inductor"


def active_dir() -> Path:
    """The directory inductor uses now: TORCHINDUCTOR_CACHE_DIR when set, else ours."""
    return Path(os.environ.get("TORCHINDUCTOR_CACHE_DIR") or cache_dir())


def use_persistent_cache() -> Path:
    """Set TORCHINDUCTOR_CACHE_DIR (unless already set) and turn on the on-disk caches; the directory."""
    path = Path(os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(cache_dir())))
    os.environ.setdefault("TORCHINDUCTOR_FX_GRAPH_CACHE", "1")
    os.environ.setdefault("TORCHINDUCTOR_AUTOGRAD_CACHE", "1")
    return path

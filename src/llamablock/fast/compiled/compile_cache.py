"""Where torch.compile keeps what it built, so that a second run does not compile again.

inductor caches compiled graphs (its FX graph cache), AOTAutograd's traced graphs and
max-autotune's kernel choices on disk, keyed by the graph, the inputs' shapes and the torch
version. By default that directory is under /tmp (`torchinductor_<user>`), which many systems
empty at boot; `use_persistent_cache` points it at the user's cache directory instead:

    $XDG_CACHE_HOME/llamablock/inductor   (default ~/.cache/llamablock/inductor)

torch reads the variable each time it needs the directory, so this works after torch is imported
(the command line calls it at start-up; tests/fast/compiled/test_compiled_decode.py checks torch sees it). A
TORCHINDUCTOR_CACHE_DIR the user set wins. llamablock.fast.compiled.aoti_step keeps its packages in the
`llamablock-aoti/` subdirectory. `--no-compile` avoids the cache entirely. `llamablock bench
compile_cache` measures a second run's start-up against the first's.
"""

from __future__ import annotations

import os
from pathlib import Path

from llamablock.util.files import user_cache_dir


def cache_dir() -> Path:
    return user_cache_dir() / "inductor"


def use_persistent_cache() -> Path:
    """Set TORCHINDUCTOR_CACHE_DIR unless already set (the caches themselves are on by default in
    torch 2.13); return the directory."""
    return Path(os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(cache_dir())))

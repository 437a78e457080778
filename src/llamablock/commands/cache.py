"""`llamablock cache`: what llamablock keeps on disk, and `--clear` to delete it.

Three things live under $XDG_CACHE_HOME/llamablock (default ~/.cache/llamablock):
  * compiled programs: the AOTInductor packages of the decode step and prefill
    (llamablock.aoti_step; the least recently used beyond 8 GB are pruned after each compile);
  * inductor's caches: compiled graphs, kernels and autotuning choices of torch.compile
    (llamablock.compile_cache), which torch never prunes;
  * trained tracer models: the 2017 and 2024 pair that `llamablock trace` and the page's tracer
    train on first use (llamablock.trace).
Each is rebuilt when next needed: compiled programs cost a compile (minutes), the tracer pair a
training run. A TORCHINDUCTOR_CACHE_DIR the user set is reported but never cleared except for
llamablock's packages in it: other programs may share that directory. Deleting while another
llamablock process compiles makes that compile fail; one that has loaded a program keeps running it.
"""

from __future__ import annotations

import shutil
from pathlib import Path

CLEAR_CHOICES = ("compiled", "models", "all")


def add_arguments(p) -> None:
    p.add_argument("--clear", nargs="?", const="compiled", choices=CLEAR_CHOICES, default=None,
                   help="delete the compile caches (the default), the trained tracer models, or all")


def _size(path: Path) -> int:
    if not path.is_dir():
        return 0
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file() and not f.is_symlink())


def entries() -> list[tuple[str, Path, int, bool]]:
    """(what, where, bytes, ours) for each cache; `ours` is False for a directory the user chose."""
    from llamablock.aoti_step import package_dir
    from llamablock.compile_cache import cache_dir, user_cache_dir
    from llamablock.trace import CACHE_VERSION

    packages = package_dir()
    inductor = packages.parent
    ours = inductor == cache_dir().absolute()
    inductor_bytes = _size(inductor) - _size(packages)
    return [("compiled programs", packages, _size(packages), True),
            ("inductor's caches", inductor, inductor_bytes, ours),
            ("trained tracer models", user_cache_dir() / CACHE_VERSION, _size(user_cache_dir() / CACHE_VERSION), True)]


def clear(what: str) -> list[tuple[Path, int]]:
    """Delete the caches `what` names ("compiled", "models", "all"); return (directory, bytes freed)."""
    if what not in CLEAR_CHOICES:
        raise ValueError(f"--clear takes one of {', '.join(CLEAR_CHOICES)}, got {what!r}")
    (_, packages, packages_bytes, _), (_, inductor, inductor_bytes, ours), (_, models, models_bytes, _) = entries()
    targets = []
    if what in ("compiled", "all"):
        # llamablock's own inductor directory goes whole (the packages are inside it); a directory the
        # user chose keeps everything but llamablock's packages.
        targets.append((inductor, inductor_bytes + packages_bytes) if ours else (packages, packages_bytes))
    if what in ("models", "all"):
        targets.append((models, models_bytes))
    freed = []
    for directory, nbytes in targets:
        if directory.is_dir():
            shutil.rmtree(directory)
            freed.append((directory, nbytes))
    return freed


def run(args) -> int:
    from llamablock.kv_calculator import human_bytes

    if args.clear is not None:
        freed = clear(args.clear)
        for directory, nbytes in freed:
            print(f"deleted {directory} ({human_bytes(nbytes)})")
        if not freed:
            print("nothing to delete")
        return 0
    for what, where, nbytes, ours in entries():
        note = "" if ours else "  (TORCHINDUCTOR_CACHE_DIR, yours: --clear keeps it)"
        print(f"{what:<22} {human_bytes(nbytes):>11}  {where}{note}")
    print("`llamablock cache --clear` deletes the compile caches (rebuilt on next use); "
          "`--clear models` the tracer models, `--clear all` both")
    return 0

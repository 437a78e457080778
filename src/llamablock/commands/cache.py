"""`llamablock cache`: what llamablock keeps on disk, and `--clear` to delete it.

Four things live under $XDG_CACHE_HOME/llamablock (default ~/.cache/llamablock):
  * compiled programs: the AOTInductor packages of the decode step and prefill
    (llamablock.fast.compiled.aoti_step; the least recently used beyond 8 GB are pruned after each compile),
    and the staging folders of compiles that were killed (`.<key>.<pid>`, their process gone);
  * inductor's caches: compiled graphs, kernels and autotuning choices of torch.compile
    (llamablock.fast.compiled.compile_cache), which torch never prunes;
  * kernel libraries: the block kernel built for this CPU (llamablock.fast.kernels.build), with
    the damaged ones it set aside (`.damaged`);
  * trained tracer models: the 2017 and 2024 pair that `llamablock trace` and the page's tracer
    train on first use (llamablock.studies.trace).
Each is rebuilt when next needed: compiled programs cost a compile (minutes), a kernel library a
few seconds, the tracer pair a training run. A TORCHINDUCTOR_CACHE_DIR the user set is reported but
never cleared except for llamablock's packages in it: other programs may share that directory.
Deleting while another llamablock process compiles makes that compile fail; one that has loaded a
program or a library keeps running it.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import NamedTuple

from llamablock.util.files import user_cache_dir

CLEAR_CHOICES = ("compiled", "models", "all")


def add_arguments(p) -> None:
    p.add_argument("--clear", nargs="?", const="compiled", choices=CLEAR_CHOICES, default=None,
                   help="delete the compile caches and kernel libraries (the default), the trained tracer models, "
                        "or all")


class Cache(NamedTuple):
    what: str
    where: Path
    nbytes: int  # files under `where`, without those of the caches listed before it that it contains
    ours: bool  # False for a directory the user chose (TORCHINDUCTOR_CACHE_DIR): --clear keeps it
    note: str = ""  # what else the listing says of it: stale staging folders, damaged libraries


def kernels_dir() -> Path:
    """Where the block kernel's libraries are built (llamablock.fast.kernels.ggml_kernel, block_op)."""
    return user_cache_dir() / "kernels"


def stale_staging(packages: Path) -> list[Path]:
    """The staging folders of compiles in `packages` whose process is gone (aoti_step names them
    `.<package>.<pid>`): left by a compile that was killed, never finished."""
    from llamablock.fast.compiled.package_check import staging

    return [p for p, alive in staging(packages) if not alive]


def live_staging(packages: Path) -> list[Path]:
    """The staging folders of compiles still running: --clear leaves them to be renamed into place."""
    from llamablock.fast.compiled.package_check import staging

    return [p for p, alive in staging(packages) if alive]


def entries() -> list[Cache]:
    """The compiled programs, inductor's caches (which contain the programs' directory), the kernel
    libraries and the tracer's models."""
    from llamablock.fast.compiled.aoti_step import directory_bytes, package_dir
    from llamablock.fast.compiled.compile_cache import cache_dir
    from llamablock.studies.trace import models_dir

    packages = package_dir()
    inductor = packages.parent
    packages_bytes = directory_bytes(packages)
    stale = stale_staging(packages)
    kernels = kernels_dir()
    damaged = list(kernels.glob("*.damaged")) if kernels.is_dir() else []
    return [Cache("compiled programs", packages, packages_bytes, True,
                  f"{len(stale)} unfinished (killed compiles' staging folders)" if stale else ""),
            Cache("inductor's caches", inductor, directory_bytes(inductor) - packages_bytes,
                  inductor == cache_dir().absolute()),
            Cache("kernel libraries", kernels, directory_bytes(kernels), True,
                  f"{len(damaged)} damaged, set aside" if damaged else ""),
            Cache("trained tracer models", models_dir(), directory_bytes(models_dir()), True)]


def clear(what: str) -> list[tuple[Path, int]]:
    """Delete the caches `what` names ("compiled", "models", "all"); return (directory, bytes freed)."""
    if what not in CLEAR_CHOICES:
        raise ValueError(f"--clear takes one of {', '.join(CLEAR_CHOICES)}, got {what!r}")
    packages, inductor, kernels, models = entries()
    targets = []
    if what in ("compiled", "all"):
        # llamablock's own inductor directory goes whole (the packages are inside it); a directory the
        # user chose keeps everything but llamablock's packages.
        targets.append((inductor.where, inductor.nbytes + packages.nbytes) if inductor.ours
                       else (packages.where, packages.nbytes))
        targets.append((kernels.where, kernels.nbytes))
    if what in ("models", "all"):
        targets.append((models.where, models.nbytes))
    from llamablock.fast.compiled.aoti_step import directory_bytes

    running = live_staging(packages.where)
    freed = []
    for directory, nbytes in targets:
        if directory.is_dir():
            try:
                _remove_all_but(directory, running)
            except OSError as e:  # a read-only cache: rmtree names only the file inside it
                raise OSError(e.errno, e.strerror, str(directory)) from None
            freed.append((directory, nbytes - sum(directory_bytes(p) for p in running if directory in p.parents)))
    return freed


def _remove_all_but(directory: Path, keep: list[Path]) -> None:
    """Delete `directory` and everything in it except the folders `keep` (and the folders above them)."""
    if directory in keep:
        return
    if not any(directory in k.parents for k in keep):
        shutil.rmtree(directory)
        return
    for p in directory.iterdir():
        if p.is_dir() and not p.is_symlink():
            _remove_all_but(p, keep)
        else:
            p.unlink()


def run(args) -> int:
    from llamablock.util.units import human_bytes

    if args.clear is not None:
        freed = clear(args.clear)
        for directory, nbytes in freed:
            print(f"deleted {directory} ({human_bytes(nbytes)})")
        if not freed:
            print("nothing to delete")
        if running := live_staging(entries()[0].where):
            print(f"kept {len(running)} staging folder{'s' * (len(running) > 1)} of compiles still running")
        return 0
    for c in entries():
        note = "" if c.ours else "  (TORCHINDUCTOR_CACHE_DIR, yours: --clear keeps it)"
        note += f"  ({c.note})" if c.note else ""
        print(f"{c.what:<22} {human_bytes(c.nbytes):>11}  {c.where}{note}")
    print("`llamablock cache --clear` deletes the compile caches and kernel libraries (rebuilt on next use); "
          "`--clear models` the tracer models, `--clear all` both")
    return 0

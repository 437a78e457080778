"""`llamablock cache`: everything llamablock keeps on disk, and `--clear` to delete it.

Under $XDG_CACHE_HOME/llamablock (default ~/.cache/llamablock):
  * compiled programs: the AOTInductor packages of the decode step and prefill
    (llamablock.fast.compiled.aoti_step; the least recently used beyond 8 GB are pruned after each compile),
    and the staging folders of compiles (`.<key>.<pid>`: those of killed ones are removed by the next
    compile or load, and by --clear; those of compiles still running are kept);
  * the builds index: which compiled builds serve which model file (llamablock.fast.compiled.builds),
    beside the packages;
  * inductor's caches: compiled graphs, kernels and autotuning choices of torch.compile
    (llamablock.fast.compiled.compile_cache), which torch never prunes;
  * kernel libraries: the block kernel built for this CPU (llamablock.fast.kernels.build), with
    the damaged ones it set aside (`.damaged`);
  * rope eval's losses: per-token losses of each pass (llamablock.studies.loss_cache);
  * trained tracer models: the 2017 and 2024 pair that `llamablock trace` and the page's tracer
    train on first use (llamablock.studies.trace);
  * benchmark files: the 1B-class GGUF files `llamablock bench size` writes once (benchmarks/bench_size.py).
In the temporary folder: `llamablock-kernels-<pid>-*` (kernels built for one process where the cache
cannot be written) and `llamablock-inductor-<pid>-*` (the test suite's inductor caches), each removed
when its process ends, left when it is killed: --clear removes those of processes that are gone.
Inductor's precompiled headers (`<temporary folder>/torchinductor_<user>/precompiled_headers`, which
torch keeps there whatever TORCHINDUCTOR_CACHE_DIR says) are listed but never cleared: every program
that compiles with torch shares them.
Each is rebuilt when next needed: compiled programs cost a compile (minutes), a kernel library a
few seconds, rope eval's losses their passes (hours for long contexts: only `--clear losses` or
`all` deletes them), the tracer pair a training run. A TORCHINDUCTOR_CACHE_DIR the user set is
reported but never cleared except for llamablock's packages in it: other programs may share that
directory. Deleting while another llamablock process compiles makes that compile fail; one that has
loaded a program or a library keeps running it.
"""

from __future__ import annotations

import getpass
import os
import re
import shutil
import tempfile
import time
from pathlib import Path
from typing import NamedTuple

from llamablock.util.files import bench_dir, process_alive, user_cache_dir

CLEAR_CHOICES = ("compiled", "losses", "models", "bench", "all")
# a temporary folder of ours: `<prefix>-<pid>-<random>`, or `<prefix>-<random>` as earlier versions named them
TEMPORARY = re.compile(r"llamablock-(?:inductor|kernels)-(?:(\d+)-)?[a-z0-9_]+")
UNCLAIMED_HOURS = 24  # a temporary folder named without its process: stale once unchanged this long


def add_arguments(p) -> None:
    p.add_argument("--clear", nargs="?", const="compiled", choices=CLEAR_CHOICES, default=None,
                   help="delete the compile caches, builds index, kernel libraries and killed processes' temporary "
                        "folders (the default), rope eval's losses, the trained tracer models, the benchmark files, or all")


class Cache(NamedTuple):
    what: str
    where: Path
    nbytes: int  # files under `where`, without those of the caches listed before it that it contains
    clear: str | None  # the --clear choice that deletes it besides "all"; None: --clear keeps it
    note: str = ""  # what else the listing says of it: staging folders, damaged libraries, whose it is
    paths: tuple[Path, ...] = ()  # what --clear deletes, where not `where` itself


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


def temporary_folders() -> list[tuple[Path, bool]]:
    """llamablock's folders in the temporary folder, each with whether it is in use: by a process
    still running (named by its pid), by this one (its TORCHINDUCTOR_CACHE_DIR), or, named before pids
    were, changed in the last UNCLAIMED_HOURS."""
    root = Path(tempfile.gettempdir())
    mine = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    found = []
    for p in sorted(root.glob("llamablock-*")) if root.is_dir() else []:
        m = TEMPORARY.fullmatch(p.name)
        if not m or not p.is_dir() or p.is_symlink():
            continue
        recent = time.time() - p.stat().st_mtime < UNCLAIMED_HOURS * 3600
        found.append((p, str(p) == mine or (process_alive(int(m.group(1))) if m.group(1) else recent)))
    return found


def headers_dir() -> Path:
    """Inductor's precompiled headers (torch._inductor.codecache._HEADER_DIR, computed as torch does)."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = f"uid_{os.getuid()}"
    user = re.sub(r'[\\/:*?"<>|]', "_", user)
    return Path(tempfile.gettempdir()) / f"torchinductor_{user}" / "precompiled_headers"


def entries() -> list[Cache]:
    """Everything llamablock writes, in the order listed: packages, the builds index, inductor's caches
    (which contain both), kernel libraries, rope eval's losses, tracer models, temporary folders and
    inductor's precompiled headers."""
    from llamablock.fast.compiled.aoti_step import directory_bytes, package_dir
    from llamablock.fast.compiled.compile_cache import cache_dir
    from llamablock.studies.loss_cache import default_cache_dir as losses_dir
    from llamablock.studies.trace import models_dir

    packages = package_dir()
    index = packages / "builds.json"
    index_bytes = sum(f.stat().st_size for f in (index, index.with_name(index.name + ".lock")) if f.is_file())
    packages_bytes = directory_bytes(packages)
    stale, running = stale_staging(packages), live_staging(packages)
    staging_note = ", ".join([f"{len(stale)} unfinished (killed compiles' staging folders)"] * bool(stale) +
                             [f"{len(running)} being compiled"] * bool(running))
    inductor = packages.parent
    ours = inductor == cache_dir().absolute()
    kernels = kernels_dir()
    damaged = list(kernels.glob("*.damaged")) if kernels.is_dir() else []
    temporary = temporary_folders()
    left = [p for p, used in temporary if not used]
    in_use = len(temporary) - len(left)
    headers = headers_dir()
    return [Cache("compiled programs", packages, packages_bytes - index_bytes, "compiled", staging_note),
            Cache("builds index", index, index_bytes, "compiled"),
            Cache("inductor's caches", inductor, directory_bytes(inductor) - packages_bytes,
                  "compiled" if ours else None, "" if ours else "TORCHINDUCTOR_CACHE_DIR, yours: --clear keeps it"),
            Cache("kernel libraries", kernels, directory_bytes(kernels), "compiled",
                  f"{len(damaged)} damaged, set aside" if damaged else ""),
            Cache("rope eval's losses", losses_dir(), directory_bytes(losses_dir()), "losses"),
            Cache("trained tracer models", models_dir(), directory_bytes(models_dir()), "models"),
            Cache("benchmark files", bench_dir(), directory_bytes(bench_dir()), "bench"),
            Cache("temporary folders", Path(tempfile.gettempdir()) / "llamablock-*",
                  sum(directory_bytes(p) for p, _ in temporary), "compiled",
                  f"{in_use} in use by running processes: --clear keeps them" if in_use else "", tuple(left)),
            Cache("inductor's headers", headers, directory_bytes(headers), None,
                  "torch's precompiled headers, shared with every program that compiles: --clear keeps them")]


def clear(what: str) -> list[tuple[Path, int]]:
    """Delete the caches `what` names (one of CLEAR_CHOICES); return (path, bytes freed) of each deleted."""
    from llamablock.fast.compiled.aoti_step import directory_bytes

    if what not in CLEAR_CHOICES:
        raise ValueError(f"--clear takes one of {', '.join(CLEAR_CHOICES)}, got {what!r}")
    found = entries()
    packages, inductor = found[0], found[2]
    running = live_staging(packages.where)
    targets = []
    for c in found:
        if c.clear is None or (what != "all" and c.clear != what):
            continue
        if c is found[1] or (c is packages and inductor.clear is not None):
            continue  # the index goes with the packages' folder, and that with llamablock's own inductor folder
        if c is inductor:
            targets.append((c.where, c.nbytes + packages.nbytes + found[1].nbytes))
        elif c is packages:  # the index is inside: deleted with it
            targets.append((c.where, c.nbytes + found[1].nbytes))
        else:
            targets += [(p, directory_bytes(p)) for p in c.paths] if c.paths else [(c.where, c.nbytes)]
    freed = []
    for path, nbytes in targets:
        if path.is_dir() and not path.is_symlink():
            try:
                _remove_all_but(path, running)
            except OSError as e:  # a read-only cache: rmtree names only the file inside it
                raise OSError(e.errno, e.strerror, str(path)) from None
            freed.append((path, nbytes - sum(directory_bytes(p) for p in running if path in p.parents)))
        elif path.is_file():
            try:
                path.unlink()
            except OSError as e:
                raise OSError(e.errno, e.strerror, str(path)) from None
            freed.append((path, nbytes))
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
        for path, nbytes in freed:
            print(f"deleted {path} ({human_bytes(nbytes)})")
        if not freed:
            print("nothing to delete")
        if running := live_staging(entries()[0].where):
            print(f"kept {len(running)} staging folder{'s' * (len(running) > 1)} of compiles still running")
        return 0
    for c in entries():
        note = f"  ({c.note})" if c.note else ""
        print(f"{c.what:<22} {human_bytes(c.nbytes):>11}  {c.where}{note}")
    print("`llamablock cache --clear` deletes the compile caches, builds index, kernel libraries and killed "
          "processes' temporary folders (rebuilt on next use); `--clear losses` rope eval's losses, `--clear models` "
          "the tracer models, `--clear bench` the benchmark files, `--clear all` all of them")
    return 0

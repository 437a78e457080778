"""Files that are never half written, folders llamablock may replace, and where it keeps its cache.

Every file llamablock writes goes through `atomic_write` (a temporary name in the same folder,
flushed to disk, then renamed over the target) and every folder through `replace_dir`, which
swaps the finished folder with the old one in one rename (Linux's renameat2 RENAME_EXCHANGE)
and removes the old one only afterwards: a reader, or a run killed at any moment, sees the old
version or the new one whole, never a mix and never neither (the temporary sits beside the target
because a rename is atomic only within one file system).

A folder llamablock may replace carries a marker file naming what wrote it (EXPORT_MARKER,
RUN_MARKER): commands refuse to replace or write into a folder without one (`owned_dir`), so a
mistyped OUT never deletes the user's own files. Staging folders carry the marker too, which is how
a later run recognises a killed writer's leftovers as its own and removes them (`clean_stale`).
A full disk while writing becomes one clear ValueError naming the file (`disk_full`). A file
that several processes read, change and write back (an index) is changed under `file_lock`.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import os
import re
import shutil
from pathlib import Path
from typing import Callable

EXPORT_MARKER = ".llamablock-export"  # in every export folder `llamablock export` and `train` write
RUN_MARKER = ".llamablock-run"  # in every training run folder `llamablock train --out` writes
_STAGE = ".llamablock-tmp-"  # staging names: .<target>.llamablock-tmp-<pid>


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


def _exchange(a: Path, b: Path) -> bool:
    """Swap `a` and `b` in one atomic rename (renameat2 RENAME_EXCHANGE); False where the system
    or file system cannot, so the caller falls back to two renames."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        fn = libc.renameat2
    except (OSError, AttributeError):
        return False
    at_fdcwd, exchange = -100, 2
    if fn(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), exchange) == 0:
        return True
    if ctypes.get_errno() in (errno.EINVAL, errno.ENOSYS, errno.ENOTSUP):
        return False
    e = ctypes.get_errno()
    raise OSError(e, os.strerror(e), str(b))


def replace_dir(tmp: str | Path, final: str | Path, marker: str | None = None) -> None:
    """Move the finished folder `tmp` to `final`, replacing what is there atomically: the two are
    swapped in one rename and the old one, now at `tmp`'s name, is removed only then (`marker`
    last, so a kill during the removal leaves a folder `clean_stale` still knows as ours). Where
    the swap is unavailable the old one is first renamed aside (to a staging name that the next
    `clean_stale` removes), so a kill in between leaves the new one whole under `tmp`'s name."""
    tmp, final = Path(tmp), Path(final)
    if not final.exists():
        os.replace(tmp, final)
        return
    if _exchange(tmp, final):
        _remove(tmp, marker)
        return
    aside = final.with_name(f".{final.name}{_STAGE}old-{os.getpid()}")
    os.replace(final, aside)
    os.replace(tmp, final)
    _remove(aside, marker)


def _remove(folder: Path, marker: str | None) -> None:
    """rmtree, with `marker` removed after everything else."""
    if marker is None or not (folder / marker).is_file():
        shutil.rmtree(folder)
        return
    for p in folder.iterdir():
        if p.name != marker:
            shutil.rmtree(p) if p.is_dir() and not p.is_symlink() else p.unlink()
    (folder / marker).unlink()
    folder.rmdir()


def staging_dir(final: str | Path, marker: str) -> Path:
    """A new empty folder beside `final` to build its replacement in, holding `marker` from the
    start (so that a killed writer's folder is recognisably ours); stale ones are removed first."""
    final = Path(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    clean_stale(final, marker)
    tmp = final.with_name(f".{final.name}{_STAGE}{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    (tmp / marker).write_text("being written\n")
    return tmp


def process_alive(pid: int) -> bool:
    """Whether process `pid` exists (a staging name's writer still running)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def clean_stale(final: str | Path, marker: str) -> None:
    """Remove the staging folders and files beside `final` left by writers that were killed: only
    those named as ours, whose process is gone, and (for folders) that hold `marker` or nothing."""
    final = Path(final)
    if not final.parent.is_dir():
        return
    pattern = re.compile(re.escape(f".{final.name}{_STAGE}") + r"(?:old-)?(\d+)$|"
                         + re.escape(f".{final.name}.") + r"(\d+)\.tmp$")
    for p in final.parent.iterdir():
        m = pattern.match(p.name)
        if not m or process_alive(int(m.group(1) or m.group(2))):
            continue
        if p.is_dir() and not p.is_symlink():
            if (p / marker).is_file():
                with contextlib.suppress(OSError):
                    _remove(p, marker)
            else:
                with contextlib.suppress(OSError):
                    p.rmdir()  # only when empty: killed between mkdir and the marker
        elif p.is_file() and m.group(2):
            p.unlink(missing_ok=True)


@contextlib.contextmanager
def file_lock(path: str | Path, required: bool = True):
    """Hold an exclusive lock (flock) on the file `path`, made if absent, for the block: processes
    that read, change and replace a shared file under it take turns, so none writes back a copy
    without another's change. The lock goes with the process, so a killed holder never leaves it
    held. Where `path` cannot be opened (a read-only folder) and not `required`, the block runs
    without it; yields whether it is held."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CREAT, 0o644)  # flock needs no write access
    except OSError:
        if required:
            raise
        yield False
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield True
    finally:
        os.close(fd)


# Ownership ------------------------------------------------------------------------------------
def is_run_dir(path: Path) -> bool:
    """A training run folder: our marker, or (runs written before the marker) checkpoints/latest
    (not any `checkpoints` folder: a home folder may hold one of another tool's)."""
    return (path / RUN_MARKER).is_file() or (path / "checkpoints" / "latest").is_file()


def is_checkpoint_dir(path: Path) -> bool:
    return (path / "state.json").is_file() and (path / "model.safetensors").is_file()


def enclosing_run(path: str | Path) -> Path | None:
    """The training run or checkpoint folder that `path` is, or lies inside, or None."""
    p = Path(os.path.abspath(path))
    for a in (p, *p.parents):
        if a.is_dir() and (is_run_dir(a) or is_checkpoint_dir(a)):
            return a
    return None


def check_out_path(out: str | Path, what: str = "OUT") -> Path:
    """`out` as an absolute path with a name; ValueError for '' (which Path reads as '.')."""
    if str(out).strip() == "":
        raise ValueError(f"{what} is empty: give the path of the folder to write")
    p = Path(os.path.abspath(out))
    if p == p.parent:
        raise ValueError(f"{what} {out} is the file system's root: give a new folder to write")
    return p


def owned_dir(out: str | Path, marker: str, what: str, allow_in: Path | None = None) -> Path:
    """`out` (absolute) when llamablock may write a `what` there: a new path, an empty folder or
    one holding `marker` (written by llamablock before), nowhere in or around a training run except
    inside `allow_in` (train's own export in its run). ValueError naming the path otherwise."""
    p = check_out_path(out)
    a_what = f"{'an' if what[0] in 'aeiou' else 'a'} {what}"
    run = enclosing_run(p)
    if run is not None and not (allow_in is not None and Path(os.path.abspath(allow_in)) == run):
        raise ValueError(f"OUT {out} is inside the training run or checkpoint {run}; writing there could destroy it: "
                         f"give a path outside it")
    if p.is_symlink() or (p.exists() and not p.is_dir()):  # a link: replacing it would write where it points
        raise ValueError(f"OUT {out} is an existing file or link, not a folder; {a_what} is a folder: give a new path")
    if p.is_dir() and any(p.iterdir()):
        if not (p / marker).is_file():
            raise ValueError(f"OUT {out} exists and holds files llamablock did not write as {a_what} (no {marker} in "
                             f"it); llamablock replaces only its own: give a new path, or empty it yourself")
        inner = next((d for d, _, _ in os.walk(p) if is_run_dir(Path(d)) or is_checkpoint_dir(Path(d))), None)
        if inner is not None:
            raise ValueError(f"OUT {out} holds the training run or checkpoint {inner}; replacing it would destroy it: "
                             "give another path")
    return p


# Full disks -------------------------------------------------------------------------------------
_FULL = re.compile(r"no space left|file too large|disk quota|code: (28|27|122)\b|\d+ requested and \d+ written",
                   re.IGNORECASE)


def is_disk_full(e: BaseException) -> bool:
    """An error from a write that ran out of room: ENOSPC, EFBIG (a file-size limit), EDQUOT, or
    the same reported in a message (safetensors' I/O error, numpy's short write under gguf)."""
    if isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EFBIG, errno.EDQUOT):
        return True
    return bool(_FULL.search(str(e)))


@contextlib.contextmanager
def disk_full(path: str | Path):
    """Turn a full-disk error raised inside the block into one ValueError naming `path`."""
    try:
        yield
    except Exception as e:
        if not is_disk_full(e):
            raise
        raise ValueError(f"no space left on device: {path} could not be written whole; free space (or raise "
                         "the file-size limit) and run the command again") from None


def user_cache_dir() -> Path:
    """llamablock's cache root, $XDG_CACHE_HOME/llamablock (default ~/.cache/llamablock): compiled
    programs, inductor's caches, the tracer's trained models."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "llamablock"


def bench_dir() -> Path:
    """Where `llamablock bench size` keeps the model files it writes once (benchmarks/bench_size.py);
    `llamablock cache` lists them and `--clear bench` deletes them."""
    return user_cache_dir() / "bench"

"""Compiling the block kernel (the C files in fast/kernels/c/) for this CPU, for both of its bindings.

The ctypes library (fast/kernels/ggml_kernel.py) and the torch operator (fast/kernels/block_op.py)
build the same C files with the same flags, through this module: which build this CPU runs
(best_isa) and its flags, which files it compiles (`sources`: linear.c and the ISA's kernel file,
as llama.cpp's CPU backend keeps one folder per architecture beside its generic code), the
compilers (CC, else cc or gcc; CXX, else c++ or g++, the ones torch.compile uses too), OpenMP
for `--threads` or a one-thread build where the compiler has none (Apple's clang), the cache's
names (kept_build: a hash of the sources and the flags, so an edited kernel or another CPU kind
builds its own, and builds of old sources unused for UNUSED_DAYS are deleted), the library
written whole or not at all (util/files.atomic_write), and one line saying why a build failed
(`attempt`).

The cache is never trusted: a library cut short maps pages past its end and the first call dies of
SIGBUS, and another file in its place fails with a traceback. So each build writes a record of
its size and sha256 beside it (`<library>.sha256`) and `verified` checks both before a path is
returned; a library that loads but lacks its symbols or its operator (the caller's `open_library`
raises Damaged) counts the same. A damaged library is moved aside (`<library>.damaged`) and
built again, once, with one line on stderr; building takes a lock beside the library, so that
two processes build it once. A cache that cannot be written (read-only, full) still serves
its valid libraries as they are; what must be built goes to a temporary folder for this process.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable, TypeVar

import torch

from llamablock.util.cpu import CPU, this_cpu
from llamablock.util.files import atomic_write, file_lock, is_disk_full

C_DIR = Path(__file__).with_name("c")
# in every build: the entry point, float32 rows for prefill's GEMM, the grouped layout's reordering at load,
# a decode step's attention over a 16-bit KV cache (fast/kernels/cache_attention.py), a whole decode step
# (fast/decode_step.py)
COMMON = [C_DIR / "linear.c", C_DIR / "dequant.c", C_DIR / "layout.c", C_DIR / "cache_attention.c",
          C_DIR / "decode_step.c"]
_AVX512 = ["-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx2", "-mfma", "-mf16c"]
# each build's flags, widest first: every build runs where the one before it does
ISAS = {"avx512vnni": [*_AVX512, "-mavx512vnni"], "avx512": _AVX512, "avx2": ["-mavx2", "-mfma", "-mf16c"],
        "portable": []}
KERNEL_FILES = {"avx512vnni": "x86.c", "avx512": "x86.c", "avx2": "x86.c", "portable": "generic.c"}
UNUSED_DAYS = 14  # a build of other sources, for the same flags, not loaded for this long is deleted
T = TypeVar("T")


class Unusable(RuntimeError):
    """A library that built but must not be called: its block table disagrees with Python's."""


class Damaged(RuntimeError):
    """A cached library that must not be loaded or called: cut short, changed, or another library
    (it does not load, or lacks the kernel's symbols or operator); or one that was damaged and
    could not be built again."""


def best_isa(cpu: CPU | None = None, caps: dict | None = None) -> str:
    """The widest build this CPU runs, by the kind that ATen dispatches to (util/cpu.py), so that
    ATEN_CPU_CAPABILITY=avx2 on an AVX-512 machine takes the AVX2 build, as on an AVX2 one:
    "avx512vnni" where cpuinfo lists AVX-512 VNNI, "avx512" (BW, VL), "avx2" with FMA and F16C,
    else "portable" C. `cpu` and `caps` (torch's cpuinfo table) simulate another machine."""
    cpu = cpu or this_cpu()
    if caps is None:
        try:
            caps = torch.cpu.get_capabilities()
        except (AttributeError, RuntimeError):  # a torch without cpuinfo's table: the portable build
            caps = {}
    if cpu.kind in ("AVX-512", "AMX") and all(caps.get(f) for f in ("avx512_f", "avx512_bw", "avx512_vl")):
        return "avx512vnni" if caps.get("avx512_vnni") else "avx512"
    if cpu.kind in ("AVX-512", "AMX", "AVX2") and all(caps.get(f) for f in ("avx2", "fma3", "f16c")):
        return "avx2"
    return "portable"


def flags(isa: str | None = None, threads: bool = True) -> list[str]:
    """Compiler flags for `isa` (one of ISAS; best_isa() when None), with OpenMP for `threads`."""
    return ["-O3", "-shared", "-fPIC", *(["-fopenmp"] if threads else []), *ISAS[isa or best_isa()]]


def sources(isa: str | None = None) -> list[Path]:
    """The C files a build of `isa` compiles: the COMMON ones and the ISA's kernels."""
    return [*COMMON, C_DIR / KERNEL_FILES[isa or best_isa()]]


def compiler(language: str = "c") -> str | None:
    """The C ("c") or C++ ("c++") compiler: $CC / $CXX, else the first on the PATH; None if none."""
    env, names = {"c": ("CC", ("cc", "gcc")), "c++": ("CXX", ("c++", "g++"))}[language]
    return os.environ.get(env) or next((p for p in map(shutil.which, names) if p), None)


def run(command: list[str]) -> None:
    """Run a compiler; RuntimeError with its first error line (else its last line) if it fails."""
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode:
        lines = done.stderr.strip().splitlines()
        errors = [ln for ln in lines if "error" in ln]
        raise RuntimeError(errors[0] if errors else lines[-1] if lines else "no output")


def kept_build(directory: Path, stem: str, flavour: str, key: str) -> Path:
    """The path `<stem>-<flavour>-<key>.so` in `directory` (made if absent; `flavour` names the flags, `key` the
    sources too), marked used now; the same flavour's other builds unused for UNUSED_DAYS are
    deleted, with their records, and so are damaged libraries set aside that long ago. Each edit
    of the kernel, and each llamablock release, leaves a build behind, and another installed
    version may still use its own, so the recently used ones stay."""
    with contextlib.suppress(OSError):  # a read-only cache: `verified` builds elsewhere
        directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{stem}-{flavour}-{key}.so"
    if path.exists():
        with contextlib.suppress(OSError):  # read-only: used as it is
            os.utime(path)
    earlier = directory.glob(f"{stem}-{'?' * 16}.so")  # named before flavours, by the key alone
    for old in [*directory.glob(f"{stem}-{flavour}-*.so"), *earlier, *directory.glob(f"{stem}-*.so.damaged")]:
        try:
            if old != path and time.time() - old.stat().st_mtime > UNUSED_DAYS * 86400:
                old.unlink()
                for beside in (record_file(old), lock_file(old)):
                    beside.unlink(missing_ok=True)
        except OSError:  # another process deleted it first, or the cache is read-only
            pass
    return path


def flavour(options: list[str]) -> str:
    """A short name for a set of compiler flags: the part of a build's name that its sources do not change."""
    return hashlib.sha256(" ".join(options).encode()).hexdigest()[:8]


def library(directory: Path, stem: str, isa: str, make: Callable[[list[str], Path], None],
            extra: bytes = b"") -> Path:
    """The shared library that make(options, path) writes from sources(isa), kept in `directory`
    (kept_build), named by a hash of those sources, the headers, `extra` (the caller's other inputs)
    and the options; built first if absent or damaged (`verified`). The flags are flags(isa), with
    OpenMP, else without (one thread) where that build fails. RuntimeError: the compiler's line
    (Damaged where the library was damaged and could not be built again)."""
    headers = sorted(C_DIR.glob("*.h"))  # blocks.h and what the ISA files include
    inputs = b"".join(p.read_bytes() for p in [*headers, *sources(isa)]) + extra

    def built(options: list[str]) -> Path:
        key = hashlib.sha256(inputs + " ".join(options).encode()).hexdigest()[:16]
        return verified(kept_build(directory, stem, flavour(options), key), lambda tmp: make(options, tmp))

    try:
        return built(flags(isa))
    except RuntimeError as first:  # a compiler without OpenMP (Apple's clang): the one-thread build
        try:
            return built(flags(isa, threads=False))
        except RuntimeError:
            if isinstance(first, Damaged):  # the reason worth saying
                raise first from None
            raise


def load(directory: Path, stem: str, isa: str, make: Callable[[list[str], Path], None],
         open_library: Callable[[Path], T], extra: bytes = b"") -> T:
    """open_library(library(...)): where it raises Damaged (the library loads but lacks its symbols
    or its operator; `open_library` unloads it first, or the loader would hand the same one back
    by name), that file is moved aside and built again, once."""
    path = library(directory, stem, isa, make, extra)
    try:
        return open_library(path)
    except Damaged as e:
        first = str(e)
    if not set_aside(path, first):  # a read-only cache: built for this process alone
        directory = scratch(directory, f"{path.name} cannot be moved aside")
    try:
        return open_library(library(directory, stem, isa, make, extra))
    except Damaged as e:
        raise Damaged(f"{path} was damaged ({first}) and, built again, still is ({e})") from None


def open_ctypes(path: Path) -> ctypes.CDLL:
    """ctypes.CDLL(path); Damaged where it does not load (not a library, or one for another machine)."""
    try:
        return ctypes.CDLL(str(path))
    except OSError as e:
        raise Damaged(f"it does not load ({e})") from None


def unload(lib: ctypes.CDLL) -> None:
    """Close `lib`'s handle (dlclose), so that loading its path again opens the file there now."""
    import _ctypes

    with contextlib.suppress(OSError, AttributeError):
        _ctypes.dlclose(lib._handle)


# The cache's checks --------------------------------------------------------------------------------
def record_file(path: Path) -> Path:
    """Where the size and sha256 of the library at `path` are kept: `<library>.sha256`."""
    return path.with_name(path.name + ".sha256")


def lock_file(path: Path) -> Path:
    return path.with_name(f".{path.name}.lock")


UNRECORDED = "it has no record of its size and sha256"


def _measure(path: Path) -> str:
    data = path.read_bytes()
    return f"{hashlib.sha256(data).hexdigest()} {len(data)}"


def record(path: Path) -> None:
    """Write the record of the library at `path` as it is now: its sha256 and size."""
    atomic_write(record_file(path), lambda tmp: tmp.write_text(_measure(path) + "\n"))


def damage(path: Path, digest: bool = True) -> str | None:
    """Why the library at `path` must not be loaded, or None when its size and sha256 are its record's.
    `digest` False compares the size alone: what a cut-short file (the SIGBUS case) shows, without
    reading a large file through (a compiled package's library holds the model's weights)."""
    try:
        want = record_file(path).read_text().split()
    except OSError:
        return UNRECORDED
    try:
        have = _measure(path).split() if digest else ["", str(path.stat().st_size)]
    except OSError as e:
        return f"it cannot be read ({e.strerror})"
    if len(want) != 2 or have[1] != want[1]:
        return f"it is {have[1]} bytes where its record says {want[1] if len(want) == 2 else 'nothing readable'}"
    return None if not digest or have[0] == want[0] else "its sha256 differs from its record"


def set_aside(path: Path, why: str, what: str = "kernel library", again: str = "building it again") -> bool:
    """Move the damaged library at `path` to `<library>.damaged` (deleted where it cannot be moved),
    saying so in one line (`what` names the file, `again` what follows); False where neither can be
    done (a read-only cache)."""
    aside = path.with_name(path.name + ".damaged")
    try:
        os.replace(path, aside)
        with contextlib.suppress(OSError):  # set aside now: kept_build deletes it UNUSED_DAYS from now
            os.utime(aside, follow_symlinks=False)
        done = f"moved it to {aside.name}"
    except OSError:  # a directory in its place, or one set aside before of another kind
        try:
            shutil.rmtree(path) if path.is_dir() and not path.is_symlink() else path.unlink()
            done = "deleted it"
        except OSError:
            return False
    record_file(path).unlink(missing_ok=True)
    state = "cannot be checked" if why == UNRECORDED else "is damaged"  # unrecorded: a build of an earlier llamablock
    print(f"llamablock: the {what} {path} {state} ({why}): {done}; {again}",
          file=sys.stderr, flush=True)
    return True


def verified(path: Path, write: Callable[[Path], object]) -> Path:
    """`path` once its size and sha256 agree with its record, built by write(tmp) first where it is
    absent, and again where it is damaged (moved aside). Under a lock beside it, so that two processes
    build it once and a reader never finds a library without its record. Where the folder cannot be
    written (read-only, full), the library is built in a temporary folder for this process."""
    with file_lock(lock_file(path), required=False):
        why = damage(path) if path.exists() or path.is_symlink() else None  # a broken link: said, replaced
        if why is None and path.exists():
            return path  # valid: used as it is, even from a read-only cache
        cannot = f"{path.name} cannot be moved aside" if why is not None and not set_aside(path, why) \
            else _unwritable(path.parent)
        if cannot is None:
            try:
                atomic_write(path, write)
            except (OSError, RuntimeError) as e:
                if not is_disk_full(e):
                    if why is None:
                        raise
                    raise Damaged(f"{path} was damaged ({why}) and could not be built again ({e})") from None
                cannot = "no space left on the device"
        if cannot is None:
            with contextlib.suppress(OSError):  # a full disk: the next process builds it again
                record(path)
            return path
    if path.parent in _scratch_dirs:
        raise RuntimeError(f"the temporary folder {path.parent} cannot be written either ({cannot})")
    return verified(scratch(path.parent, cannot) / path.name, write)


def _unwritable(folder: Path) -> str | None:
    """Why no file can be made in `folder` (read-only, not ours, missing), or None."""
    try:
        with tempfile.TemporaryFile(dir=folder):
            return None
    except OSError as e:
        return e.strerror or str(e)


_scratch_dirs: list[Path] = []  # this process's temporary folder, once made


def scratch(directory: Path, why: str) -> Path:
    """A temporary folder for this process's libraries, where `directory` cannot hold them (one
    line saying so); removed at exit."""
    if not _scratch_dirs:
        _scratch_dirs.append(Path(tempfile.mkdtemp(prefix=f"llamablock-kernels-{os.getpid()}-")))
        atexit.register(shutil.rmtree, _scratch_dirs[0], True)
    print(f"llamablock: the kernel cache {directory} cannot be written ({why}); building in {_scratch_dirs[0]} "
          "for this process only", file=sys.stderr, flush=True)
    return _scratch_dirs[0]


def attempt(why_not: list[str], what: str, load: Callable[[], T]) -> T | None:
    """load(), or None with one line appended to `why_not` saying why `what` cannot be used."""
    try:
        return load()
    except Unusable as e:
        why_not.append(f"{what} is unusable ({e})")
    except Damaged as e:
        why_not.append(f"{what} cannot be used ({e})")
    except (OSError, RuntimeError) as e:
        why_not.append(f"{what} did not build ({e})")
    return None

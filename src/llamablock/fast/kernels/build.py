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
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import time
from pathlib import Path
from typing import Callable, TypeVar

import torch

from llamablock.util.cpu import CPU, this_cpu
from llamablock.util.files import atomic_write

C_DIR = Path(__file__).with_name("c")
HEADER, DRIVER = C_DIR / "blocks.h", C_DIR / "linear.c"
_AVX512 = ["-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx2", "-mfma", "-mf16c"]
# each build's flags, widest first: every build runs where the one before it does
ISAS = {"avx512vnni": [*_AVX512, "-mavx512vnni"], "avx512": _AVX512, "avx2": ["-mavx2", "-mfma", "-mf16c"],
        "portable": []}
KERNEL_FILES = {"avx512vnni": "x86.c", "avx512": "x86.c", "avx2": "x86.c", "portable": "generic.c"}
UNUSED_DAYS = 14  # a build of other sources, for the same flags, not loaded for this long is deleted
T = TypeVar("T")


class Unusable(RuntimeError):
    """A library that built but must not be called: its block table disagrees with Python's."""


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
    """The C files a build of `isa` compiles: the entry point and the ISA's kernels."""
    return [DRIVER, C_DIR / KERNEL_FILES[isa or best_isa()]]


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
    deleted. Each edit of the kernel, and each llamablock release, leaves a build behind, and
    another installed version may still use its own, so the recently used ones stay."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{stem}-{flavour}-{key}.so"
    if path.exists():
        os.utime(path)
    earlier = directory.glob(f"{stem}-{'?' * 16}.so")  # named before flavours, by the key alone
    for old in [*directory.glob(f"{stem}-{flavour}-*.so"), *earlier]:
        try:
            if old != path and time.time() - old.stat().st_mtime > UNUSED_DAYS * 86400:
                old.unlink()
        except OSError:  # another process deleted it first
            pass
    return path


def flavour(options: list[str]) -> str:
    """A short name for a set of compiler flags: the part of a build's name that its sources do not change."""
    return hashlib.sha256(" ".join(options).encode()).hexdigest()[:8]


def library(directory: Path, stem: str, isa: str, make: Callable[[list[str], Path], None],
            extra: bytes = b"") -> Path:
    """The shared library that make(options, path) writes from sources(isa), kept in `directory`
    (kept_build), named by a hash of those sources, the header, `extra` (the caller's other inputs)
    and the options; built first if absent. The flags are flags(isa), with OpenMP, else without
    (one thread) where that build fails. RuntimeError: the compiler's line."""
    inputs = b"".join(p.read_bytes() for p in [HEADER, *sources(isa)]) + extra

    def built(options: list[str]) -> Path:
        key = hashlib.sha256(inputs + " ".join(options).encode()).hexdigest()[:16]
        path = kept_build(directory, stem, flavour(options), key)
        if not path.exists():
            atomic_write(path, lambda tmp: make(options, tmp))
        return path

    try:
        return built(flags(isa))
    except RuntimeError:  # a compiler without OpenMP (Apple's clang): the one-thread build
        return built(flags(isa, threads=False))


def attempt(why_not: list[str], what: str, load: Callable[[], T]) -> T | None:
    """load(), or None with one line appended to `why_not` saying why `what` cannot be used."""
    try:
        return load()
    except Unusable as e:
        why_not.append(f"{what} is unusable ({e})")
    except (OSError, RuntimeError) as e:
        why_not.append(f"{what} did not build ({e})")
    return None

"""Build ggml_dot.c once per machine and call it: the decode kernel over a GGUF's own blocks.

The C file is compiled on first use with the system's C compiler (the one torch.compile uses
too), for the vector extensions this CPU has (best_isa): AVX-512 BW where ATen runs AVX-512
kernels, AVX2 with FMA and F16C where it runs AVX2 ones, else portable C that the compiler
vectorizes as it can (Arm, older x86); with OpenMP for
`--threads`, or on one thread where the compiler has none (Apple's clang). The shared
library is kept in the user's cache, named by a hash of the source and the flags, so an edited
kernel or another CPU kind builds its own (and builds of old sources unused for two weeks are
deleted: kept_build); a build is one compiler call on one C file. Where no
compiler works, `kernel()` is None with the reason (`why_not()`), and the loader re-quantizes
the blocks into PyTorch's packed formats instead, saying why (fast/plan.py load_in_format).

Called through ctypes: one call per layer, with the GIL released; the data pointers are torch
tensors' own, so no weight is copied. `LLAMABLOCK_NO_KERNEL=1` turns the kernel off (the tests
use it to exercise the fallback; `llamablock bench file_blocks` compares both).
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import shutil
import subprocess
import time
from pathlib import Path

import torch

from llamablock.util.cpu import CPU, this_cpu
from llamablock.util.files import atomic_write, user_cache_dir

SOURCE = Path(__file__).with_name("ggml_dot.c")
TYPE_IDS = {"Q4_0": 2, "Q4_1": 3, "Q8_0": 8}  # GGML's type ids, as ggml_dot.c's enum
BLOCK_BYTES = {"Q4_0": 18, "Q4_1": 20, "Q8_0": 34}  # 32 weights each (ggml-common.h)
GROUP, GROUPED = 8, 256  # rows per group; added to a type id for that layout (ggml_dot.c)
# the builds that are faster on groups of 8 rows than on the file's order, decode and prefill alike
# (`llamablock bench file_blocks` times both layouts in each build); the portable build keeps the
# file's order: it has no vector code of its own for either
GROUPING_ISAS = ("avx512", "avx2")
_why_not: list[str] = []


ISAS = {"avx512": ["-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx2", "-mfma", "-mf16c"],
        "avx2": ["-mavx2", "-mfma", "-mf16c"], "portable": []}


def best_isa(cpu: CPU | None = None, caps: dict | None = None) -> str:
    """The widest build this CPU runs, by the kind that ATen dispatches to (util/cpu.py), so that
    ATEN_CPU_CAPABILITY=avx2 on an AVX-512 machine takes the AVX2 build, as on an AVX2 one:
    "avx512" (a block's 32 products in one madd; `llamablock bench file_blocks` times it beside
    "avx2"), "avx2" with FMA and F16C, else "portable" C. `cpu` and `caps` (torch's cpuinfo
    table) simulate another machine."""
    cpu = cpu or this_cpu()
    if caps is None:
        try:
            caps = torch.cpu.get_capabilities()
        except (AttributeError, RuntimeError):  # a torch without cpuinfo's table: the portable build
            caps = {}
    if cpu.kind in ("AVX-512", "AMX") and all(caps.get(f) for f in ("avx512_f", "avx512_bw", "avx512_vl")):
        return "avx512"
    if cpu.kind in ("AVX-512", "AMX", "AVX2") and all(caps.get(f) for f in ("avx2", "fma3", "f16c")):
        return "avx2"
    return "portable"


def groups_rows() -> bool:
    """Whether a layer should hold its blocks in groups of 8 rows here (file_blocks.group_rows)."""
    return kernel() is not None and best_isa() in GROUPING_ISAS


def flags(isa: str | None = None, threads: bool = True) -> list[str]:
    """Compiler flags for `isa` (one of ISAS; best_isa() when None), with OpenMP for `threads`."""
    return ["-O3", "-shared", "-fPIC", *(["-fopenmp"] if threads else []), *ISAS[isa or best_isa()]]


UNUSED_DAYS = 14  # a build of other sources, for the same flags, not loaded for this long is deleted


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


def _built(directory: Path, compiler: str, options: list[str]) -> Path:
    """The library built with `options`, named by a hash of the source and the options (built if absent)."""
    key = hashlib.sha256(SOURCE.read_bytes() + " ".join(options).encode()).hexdigest()[:16]
    path = kept_build(directory, "ggml_dot", flavour(options), key)
    if not path.exists():
        def write(tmp: Path) -> None:
            done = subprocess.run([compiler, *options, str(SOURCE), "-o", str(tmp), "-lm"], capture_output=True,
                                  text=True)
            if done.returncode:
                raise RuntimeError(done.stderr.strip().splitlines()[-1] if done.stderr.strip() else "no output")

        atomic_write(path, write)
    return path


def load(directory: Path, isa: str | None = None) -> ctypes.CDLL:
    """The library for flags(isa), kept in `directory`, built first if absent; without OpenMP (one
    thread) where the compiler has none, as Apple's clang. RuntimeError (the compiler's last line) or
    OSError."""
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        raise RuntimeError("no C compiler (cc) on the PATH")
    try:
        path = _built(directory, compiler, flags(isa))
    except RuntimeError:
        path = _built(directory, compiler, flags(isa, threads=False))
    lib = ctypes.CDLL(str(path))
    lib.lb_linear.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p,
                              ctypes.c_int64, ctypes.c_void_p, ctypes.c_int]
    return lib


@functools.cache
def kernel() -> ctypes.CDLL | None:
    """The library for this CPU, built if this machine has none yet; None (see why_not) where it cannot be."""
    if os.environ.get("LLAMABLOCK_NO_KERNEL") == "1":
        _why_not.append("LLAMABLOCK_NO_KERNEL=1")
        return None
    try:
        return load(user_cache_dir() / "kernels")
    except (OSError, RuntimeError) as e:
        _why_not.append(f"the block kernel did not build ({e})")
        return None


def why_not() -> str:
    """Why kernel() is None, in a few words ('' when it is not)."""
    kernel()
    return _why_not[-1] if _why_not else ""


def matmul(type_name: str, blocks: torch.Tensor, x: torch.Tensor, threads: int | None = None,
           lib: ctypes.CDLL | None = None, grouped: bool = False) -> torch.Tensor:
    """y (m, n) float32 = x (m, k) W^T, W the (n, k / 32 * block bytes) uint8 `blocks` of `type_name`
    (in groups of 8 rows where `grouped`), x quantized to 16 bits per block of 32 first (ggml_dot.c
    says how); `lib` another build than kernel()."""
    x = x.contiguous().float()
    y = torch.empty(x.shape[0], blocks.shape[0])
    if (lib or kernel()).lb_linear(TYPE_IDS[type_name] + (GROUPED if grouped else 0), blocks.data_ptr(), blocks.shape[0], x.shape[1], x.data_ptr(),
                          x.shape[0], y.data_ptr(), threads or torch.get_num_threads()):
        raise MemoryError(f"no memory for the block kernel's copy of x ({tuple(x.shape)})")
    return y

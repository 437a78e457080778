"""`torch.ops.llamablock.block_linear`: the block kernel as a PyTorch operator, for compiled programs.

torch.export and AOTInductor trace tensor operations; a ctypes call is opaque to them. So the
compiled engine over a file's own blocks (fast/compiled/static_decode.py, fast/compiled/compiled_decode.py) calls the
kernel through this operator, registered in C++ (block_op.cpp, linked with ggml_dot.c): AOTInductor
then emits a call to it by name, and a process that loads the program must have loaded the
operator first (`load()`). Eager layers keep the ctypes call (fast/kernels/ggml_kernel.py): building
against torch's headers takes the C++ compiler several seconds, where the C file alone takes
well under one, and eager decode does not need it. Both call the same C function with the same
flags, so they give the same numbers (tests/fast/kernels/test_file_blocks.py).

The library is kept beside the kernel's in the user's cache, named by a hash of both sources,
the flags and the torch version (its headers and ABI).
"""

from __future__ import annotations

import functools
import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import torch

from llamablock.fast.kernels.ggml_kernel import SOURCE, flags, flavour, kept_build
from llamablock.util.files import atomic_write, user_cache_dir

OP_SOURCE = Path(__file__).with_name("block_op.cpp")
LOADED = False  # set once the operator is registered: BlockLinear then calls it, traced or not
_why_not: list[str] = []


def _run(command: list[str]) -> None:
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode:
        lines = [ln for ln in done.stderr.splitlines() if "error" in ln] or done.stderr.strip().splitlines()
        raise RuntimeError(lines[0] if lines else "no output")


def _build(path: Path, cc: str, cxx: str, options: list[str]) -> None:
    from torch.utils import cpp_extension

    def write(tmp: Path) -> None:
        with tempfile.TemporaryDirectory() as work:
            obj = Path(work) / "ggml_dot.o"
            _run([cc, *[o for o in options if o != "-shared"], "-c", str(SOURCE), "-o", str(obj)])
            includes = [f"-I{p}" for p in cpp_extension.include_paths()]
            libs = [f"-L{p}" for p in cpp_extension.library_paths()]
            abi = f"-D_GLIBCXX_USE_CXX11_ABI={int(torch._C._GLIBCXX_USE_CXX11_ABI)}"
            _run([cxx, "-O2", "-shared", "-fPIC", "-std=c++17", abi, *includes, str(OP_SOURCE), str(obj), "-o",
                  str(tmp), *libs, "-ltorch", "-ltorch_cpu", "-lc10", *[o for o in options if o == "-fopenmp"]])

    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, write)


@functools.cache
def load() -> bool:
    """Register torch.ops.llamablock.block_linear (building it first if this machine has none); False
    (see why_not) where it cannot be built."""
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    cxx = os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++")
    if cc is None or cxx is None:
        _why_not.append("no C and C++ compilers (cc, c++) on the PATH")
        return False
    def built(options: list[str]) -> Path:
        key = hashlib.sha256(SOURCE.read_bytes() + OP_SOURCE.read_bytes() + " ".join(options).encode()
                             + torch.__version__.encode()).hexdigest()[:16]
        path = kept_build(user_cache_dir() / "kernels", "block_op", flavour(options), key)
        if not path.exists():
            _build(path, cc, cxx, options)
        return path

    try:
        try:
            path = built(flags())
        except RuntimeError:  # a compiler without OpenMP, as for the ctypes library (fast/kernels/ggml_kernel.py)
            path = built(flags(threads=False))
        torch.ops.load_library(str(path))
    except (OSError, RuntimeError) as e:
        _why_not.append(f"the block operator did not build ({e})")
        return False

    @torch.library.register_fake("llamablock::block_linear")
    def _(x, blocks, type):  # shapes for tracing: (..., k) -> (..., n) float32
        return x.new_empty((*x.shape[:-1], blocks.shape[0]), dtype=torch.float32)

    global LOADED
    LOADED = True
    return True


def why_not() -> str:
    load()
    return _why_not[-1] if _why_not else ""

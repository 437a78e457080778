"""`torch.ops.llamablock.block_linear`: the block kernel as a PyTorch operator, for compiled programs.

torch.export and AOTInductor trace tensor operations; a ctypes call is opaque to them. So the
compiled engine over a file's own blocks (fast/compiled/static_decode.py, fast/compiled/compiled_decode.py)
calls the kernel through this operator, registered in C++ (block_op.cpp, linked with the kernel's
C files): AOTInductor then emits a call to it by name, and a process that loads the program must
have loaded the operator first (`load()`). Eager layers keep the ctypes call (fast/kernels/ggml_kernel.py):
building against torch's headers takes the C++ compiler several seconds, where the C files alone
take well under one, and eager decode does not need it. Both are built by fast/kernels/build.py
from the same C files with the same flags, so they give the same numbers
(tests/fast/kernels/test_file_blocks.py); `linear` calls the operator with ggml_kernel.matmul's
arguments, so a layer holds either as its binding.

The library is kept beside the kernel's in the user's cache, named by a hash of its sources, the
flags and the torch version (its headers and ABI), checked against its record and rebuilt where
damaged as the ctypes library is (build.load); its block table is checked as the ctypes library's
is (ggml_kernel.check_table) before the operator is registered.
"""

from __future__ import annotations

import functools
import tempfile
from pathlib import Path

import torch

from llamablock.fast.kernels import build
from llamablock.fast.kernels.ggml_kernel import GROUPED, ROWS, TYPE_IDS, check_table
from llamablock.util.files import user_cache_dir

OP_SOURCE = Path(__file__).with_name("block_op.cpp")
_why_not: list[str] = []


def _maker(isa: str):
    """make(options, out) for build.library: the C files compiled to objects, linked with the operator."""
    from torch.utils import cpp_extension

    def make(options: list[str], out: Path) -> None:
        cc, cxx = build.compiler("c"), build.compiler("c++")
        if cc is None or cxx is None:
            raise RuntimeError("no C and C++ compilers (cc, c++) on the PATH")
        with tempfile.TemporaryDirectory() as work:
            objects = []
            for source in build.sources(isa):
                objects.append(str(Path(work) / f"{source.stem}.o"))
                build.run([cc, *[o for o in options if o != "-shared"], "-c", str(source), "-o", objects[-1]])
            includes = [f"-I{p}" for p in cpp_extension.include_paths()]
            libs = [f"-L{p}" for p in cpp_extension.library_paths()]
            abi = f"-D_GLIBCXX_USE_CXX11_ABI={int(torch._C._GLIBCXX_USE_CXX11_ABI)}"
            build.run([cxx, "-O2", "-shared", "-fPIC", "-std=c++17", abi, *includes, str(OP_SOURCE), *objects, "-o",
                       str(out), *libs, "-ltorch", "-ltorch_cpu", "-lc10", *[o for o in options if o == "-fopenmp"]])

    return make


def _open(path: Path) -> str:
    """`path`, once the library there is loaded (which registers the operator) and its block table
    checked (ggml_kernel.check_table, on the handle torch loads next, before any call);
    build.Damaged (unloaded first) where it lacks the kernel's symbols or registers no
    llamablock::block_linear."""
    lib = build.open_ctypes(path)
    try:
        check_table(lib)
    except AttributeError as e:
        build.unload(lib)
        raise build.Damaged(f"it lacks the kernel's symbols: {str(e).split(': ', 1)[-1]}") from None
    if not hasattr(torch.ops.llamablock, "block_linear"):
        build.unload(lib)
        raise build.Damaged("it registers no operator llamablock::block_linear") from None
    return str(path)


def _register() -> bool:
    isa = build.best_isa()
    torch.ops.load_library(build.load(user_cache_dir() / "kernels", "block_op", isa, _maker(isa), _open,
                                      extra=OP_SOURCE.read_bytes() + torch.__version__.encode()))

    @torch.library.register_fake("llamablock::block_linear")
    def _(x, blocks, type, layout=ROWS, gemm_from=0):  # shapes for tracing: (..., k) -> (..., n) float32
        return x.new_empty((*x.shape[:-1], blocks.shape[0]), dtype=torch.float32)

    @torch.library.register_fake("llamablock::cache_attention")
    def _(q, k, v, allowed, scale):  # (b, h, hd) against caches (b, n_kv, L, hd) -> (b, h, hd) float32
        return q.new_empty(q.shape, dtype=torch.float32)

    @torch.library.register_fake("llamablock::prompt_attention")
    def _(q, k, v, scale, chunk, first, last):  # q (b, h, t, hd) -> (b, h, t, hd) contiguous
        return q.new_empty(q.shape)

    return True


@functools.cache
def load() -> bool:
    """Register torch.ops.llamablock.block_linear (building it first if this machine has none); False
    (see why_not) where it cannot be built or its block table disagrees with gguf's."""
    return bool(build.attempt(_why_not, "the block operator", _register))


def why_not() -> str:
    """Why load() is False, in a few words ('' when it is not)."""
    load()
    return _why_not[-1] if _why_not else ""


def linear(type_name: str, blocks: torch.Tensor, x: torch.Tensor, threads: int | None = None,
           lib: object = None, grouped: bool = False, gemm_from: int | None = None) -> torch.Tensor:
    """ggml_kernel.matmul through the operator, which compiled programs can trace: y (m, n) float32
    = x (m, k) W^T for the (n, k / block weights * block bytes) uint8 `blocks` of `type_name` (in
    groups of 8 rows where `grouped`, a ggml_kernel.GROUPABLE type), by a float GEMM over the dequantized
    rows from `gemm_from` rows of x on (None: never), as matmul's. `threads` and `lib` are
    matmul's, unused: the operator runs on torch's threads (at::get_num_threads) with the one
    library load() registered."""
    if not load():
        raise RuntimeError(f"the block operator is not available: {why_not()}")
    return torch.ops.llamablock.block_linear(x, blocks, TYPE_IDS[type_name], GROUPED if grouped else ROWS,
                                             gemm_from or 0)

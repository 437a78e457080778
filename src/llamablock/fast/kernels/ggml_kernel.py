"""The block kernel through ctypes: the decode kernel over a GGUF's own blocks, for eager layers.

The C files (fast/kernels/c/, blocks.h says what they compute) are compiled on first use for this
CPU by fast/kernels/build.py and kept in the user's cache; where no compiler works, `kernel()` is
None with the reason (`why_not()`), and the loader re-quantizes the blocks into PyTorch's packed
formats instead, saying why (fast/plan.py load_in_format).

KEPT is the one Python table of the block types the kernel computes (blocks of 32 weights, and
the K types' super-blocks of 256); their sizes come from the gguf package (GGML_QUANT_SIZES, the
reference that reads the files), and a loaded library's own table (lb_block_bytes,
lb_block_weights) must agree for every kept type, or the library is refused (`check_table`): a
block size out of step would read every row at the wrong bytes. GROUPABLE are the kept types that
also have the grouped layout (groups of 8 rows, file_blocks.group_rows; the library's
lb_block_groups); the others run in the file's order of rows only.

One call per layer, with the GIL released; the data pointers are torch tensors' own, so no
weight is copied. `LLAMABLOCK_NO_KERNEL=1` turns the kernel off (the tests use it to exercise the
fallback; `llamablock bench file_blocks` compares both). Compiled programs call the same C
function as a torch operator (fast/kernels/block_op.py).
"""

from __future__ import annotations

import ctypes
import functools
import os
from pathlib import Path

import gguf
import torch

from llamablock.fast.kernels import build
from llamablock.fast.kernels.build import ISAS, UNUSED_DAYS, best_isa, flags, kept_build  # noqa: F401 (this module's face)
from llamablock.util.files import user_cache_dir

# the block types the kernel computes (c/blocks.h LB_TYPE_TABLE), and those it also computes in groups of 8 rows
KEPT = ("Q4_0", "Q4_1", "Q5_0", "Q8_0", "Q4_K", "Q5_K", "Q6_K")
GROUPABLE = ("Q4_0", "Q4_1", "Q8_0", "Q4_K", "Q5_K", "Q6_K")
TYPE_IDS = {name: int(gguf.GGMLQuantizationType[name]) for name in KEPT}  # GGML's ids: lb_linear's `type`
SIZES = {name: tuple(gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[name]]) for name in KEPT}  # (weights, bytes)
BLOCK_BYTES = {name: size[1] for name, size in SIZES.items()}
GROUP = 8  # rows per group of the grouped layout (c/blocks.h LB_GROUP)
GEMM_TILE = 256  # weight rows dequantized per float GEMM (matmul's gemm_from; block_op.cpp's too): 1-8 MiB
# From how many rows of x a block layer dequantizes for a float32 GEMM (matmul's gemm_from), per CPU
# kind (util/cpu.py); None: the kernel at every length. Read off `llamablock bench prefill_crossover`'s
# blocks table (BENCHMARKS.md): on AVX2 MKL's float32 GEMM outruns the kernel's 16-bit integer
# products, by 128 rows level with it on SmolLM2's small layers and ahead on the 1B shapes, further
# ahead with every row after. On an AVX-512 CPU with VNNI (its build's prefill panels) the kernel is
# ahead at every row count measured, to 512, for every type and shape; one without VNNI (the plain
# avx512 build, no panels) and AMX (the VNNI build) are not measured and keep the kernel until a run
# there says otherwise. Other CPUs (the portable build, with no vector code of its own) follow
# GEMM_FROM_UNMEASURED, as quant.py's packed layers do on CPUs not measured.
GEMM_FROM_BY_CPU = {"AVX2": 128, "AVX-512": None, "AMX": None}
GEMM_FROM_UNMEASURED = 32
ROWS, GROUPED = 0, 1  # lb_linear's `layout`: the file's order, groups of 8 rows (c/blocks.h LB_ROWS, LB_GROUPS)
# the builds that are faster on groups of 8 rows than on the file's order, decode and prefill alike
# (`llamablock bench file_blocks` times both layouts in each build); the portable build keeps the
# file's order: it has no vector code of its own for either
GROUPING_ISAS = ("avx512vnni", "avx512", "avx2")
_why_not: list[str] = []


def gemm_rows(kind: str) -> int | None:
    """Rows of x from which a block layer runs the dequantized float32 GEMM on a CPU of `kind`; None: never."""
    return GEMM_FROM_BY_CPU.get(kind, GEMM_FROM_UNMEASURED)


def groups_rows() -> bool:
    """Whether a layer should hold its blocks in groups of 8 rows here (file_blocks.group_rows)."""
    return kernel() is not None and best_isa() in GROUPING_ISAS


def check_table(lib) -> None:
    """build.Unusable unless `lib`'s block table (lb_block_weights, lb_block_bytes) gives gguf's
    (weights, bytes) for every kept type. (Its lb_block_groups need no check here: a layout it
    lacks is refused by lb_linear, never misread.)"""
    wrong = []
    for name, type_id in TYPE_IDS.items():
        theirs = (lib.lb_block_weights(type_id), lib.lb_block_bytes(type_id))
        if theirs != SIZES[name]:
            wrong.append(f"{name} blocks are {theirs[1]} bytes of {theirs[0]} weights there, "
                         f"{SIZES[name][1]} bytes of {SIZES[name][0]} in gguf")
    if wrong:
        raise build.Unusable(f"its block table disagrees with gguf.GGML_QUANT_SIZES: {'; '.join(wrong)}")


def load(directory: Path, isa: str | None = None) -> ctypes.CDLL:
    """The library for `isa` (best_isa() when None), kept in `directory`, built first if absent or
    damaged (build.load: checked against its record, and here for its symbols); without OpenMP (one
    thread) where the compiler has none, as Apple's clang. RuntimeError (the compiler's line;
    build.Unusable for a library whose block table disagrees, build.Damaged for one damaged that
    could not be built again) or OSError."""
    isa = isa or best_isa()

    def make(options: list[str], out: Path) -> None:
        cc = build.compiler("c")
        if cc is None:
            raise RuntimeError("no C compiler (cc) on the PATH")
        build.run([cc, *options, *map(str, build.sources(isa)), "-o", str(out), "-lm"])

    return build.load(directory, "ggml_dot", isa, make, _open)


def _open(path: Path) -> ctypes.CDLL:
    """The library at `path`, lb_linear's arguments declared and its block table checked;
    build.Damaged (unloaded first) where it lacks the kernel's symbols: another library in its place."""
    lib = build.open_ctypes(path)
    try:
        lib.lb_linear_bits.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64,
                                       ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p, ctypes.c_int, ctypes.c_int]
        lib.lb_dequantize.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64,
                                      ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p, ctypes.c_int]
        lib.lb_group_rows.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_int]
        sizes = [ctypes.c_int64] * 5  # n_kv, g, hd, head_stride, n: fast/kernels/cache_attention.py
        lib.lb_cache_scores.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, *sizes, ctypes.c_float,
                                        ctypes.c_void_p, ctypes.c_int]
        lib.lb_cache_values.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, *sizes, ctypes.c_void_p,
                                        ctypes.c_int]
        lib.lb_decode_layers.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64,
                                         *[ctypes.c_void_p] * 4, ctypes.c_int]  # fast/decode_step.py
        lib.lb_decode_work.argtypes, lib.lb_decode_work.restype = [ctypes.c_void_p, ctypes.c_int64], ctypes.c_int64
        check_table(lib)
    except AttributeError as e:
        build.unload(lib)
        raise build.Damaged(f"it lacks the kernel's symbols: {str(e).split(': ', 1)[-1]}") from None
    return lib


@functools.cache
def kernel() -> ctypes.CDLL | None:
    """The library for this CPU, built if this machine has none yet; None (see why_not) where it cannot be."""
    if os.environ.get("LLAMABLOCK_NO_KERNEL") == "1":
        _why_not.append("LLAMABLOCK_NO_KERNEL=1")
        return None
    return build.attempt(_why_not, "the block kernel", lambda: load(user_cache_dir() / "kernels"))


def why_not() -> str:
    """Why kernel() is None, in a few words ('' when it is not)."""
    kernel()
    return _why_not[-1] if _why_not else ""


def failed(status: int, type_name: str, n: int, k: int) -> Exception:
    """The exception for lb_linear's non-zero result (c/blocks.h LB_NO_MEMORY, LB_UNKNOWN, LB_BAD_SHAPE)."""
    if status == -1:
        return MemoryError(f"no memory for the block kernel's working copy (of x, or of 8 rows of {k} weights)")
    if status == -2:
        return ValueError(f"the block kernel's library does not compute {type_name} in that layout"
                          f" (groups of {GROUP} rows are {', '.join(GROUPABLE)} only)")
    return ValueError(f"{type_name} rows of {k} weights are not whole blocks, or {n} rows not whole groups of {GROUP}")


def dequantize(type_name: str, blocks: torch.Tensor, k: int, rows: slice = slice(None), grouped: bool = False,
               threads: int | None = None, lib: ctypes.CDLL | None = None, out: torch.Tensor | None = None
               ) -> torch.Tensor:
    """(rows, k) float32: the exact weights of `rows` (a step-1 slice) of the (n, k / block weights *
    block bytes) uint8 `blocks` (c/dequant.c), into `out` (at least that many rows) where given."""
    i0, i1, step = rows.indices(blocks.shape[0])
    if step != 1:
        raise ValueError(f"dequantize takes a run of rows (a slice of step 1), not step {step}")
    if out is not None and (out.dtype != torch.float32 or not out.is_contiguous() or out.shape[0] < i1 - i0
                            or out.shape[1:] != (k,)):
        raise ValueError(f"dequantize's out must be contiguous float32 of at least {i1 - i0} rows of {k}")
    out = torch.empty(i1 - i0, k) if out is None else out[:i1 - i0]
    status = (lib or kernel()).lb_dequantize(TYPE_IDS[type_name], GROUPED if grouped else ROWS, blocks.data_ptr(),
                                             blocks.shape[0], k, i0, i1, out.data_ptr(),
                                             threads or torch.get_num_threads())
    if status:
        raise failed(status, type_name, blocks.shape[0], k)
    return out


def group_in_place(type_name: str, blocks: torch.Tensor, threads: int | None = None,
                   lib: ctypes.CDLL | None = None) -> torch.Tensor:
    """`blocks`, (n, k / block weights * block bytes) uint8 contiguous rows in the file's order,
    reordered in place into groups of 8 rows (c/layout.c; file_blocks.group_rows' layout)."""
    n, k = blocks.shape[0], blocks.shape[1] // BLOCK_BYTES[type_name] * SIZES[type_name][0]
    if blocks.dtype != torch.uint8 or not blocks.is_contiguous() or blocks.shape[1] % BLOCK_BYTES[type_name]:
        raise ValueError(f"grouping in place needs contiguous rows of whole {type_name} blocks")
    status = (lib or kernel()).lb_group_rows(TYPE_IDS[type_name], blocks.data_ptr(), n, k,
                                             threads or torch.get_num_threads())
    if status:
        raise failed(status, type_name, n, k)
    return blocks


def _float_gemm(type_name, blocks, x, threads, lib, grouped) -> torch.Tensor:
    """matmul's y by GEMM_TILE weight rows at a time: dequantized (their float32 tile stays in cache),
    then one float32 torch.mm; block_op.cpp's float_gemm does the same calls, so the two engines agree."""
    y = torch.empty(x.shape[0], blocks.shape[0])
    tile = torch.empty(min(GEMM_TILE, blocks.shape[0]), x.shape[1])
    for i in range(0, blocks.shape[0], GEMM_TILE):
        w = dequantize(type_name, blocks, x.shape[1], slice(i, i + GEMM_TILE), grouped, threads, lib, tile)
        y[:, i:i + len(w)] = x @ w.T  # (m, tile rows)
    return y


def matmul(type_name: str, blocks: torch.Tensor, x: torch.Tensor, threads: int | None = None,
           lib: ctypes.CDLL | None = None, grouped: bool = False, bits: int = 16,
           gemm_from: int | None = None) -> torch.Tensor:
    """y (m, n) float32 = x (m, k) W^T, W the (n, k / block weights * block bytes) uint8 `blocks` of
    `type_name` (in groups of 8 rows where `grouped`, a GROUPABLE type), x quantized per block of 32
    first to `bits`: 16, what every engine runs, or 8, llama.cpp's, faster where the products bound
    the call and less exact (`llamablock bench activations`; c/blocks.h says how); `lib` another
    build than kernel(). From `gemm_from` rows of x on (the plan's crossover, None: never), W is
    dequantized a tile at a time for a float32 GEMM instead, x unquantized (`bits` unused): faster
    for a long prompt where the CPU's float GEMM outruns the integer products (`llamablock bench
    prefill_crossover`), and exact to float32's sums."""
    if bits not in (8, 16):
        raise ValueError(f"the block kernel takes its activations in 8 or 16 bits, not {bits}")
    x = x.contiguous().float()
    if gemm_from and x.shape[0] >= gemm_from:
        return _float_gemm(type_name, blocks, x, threads, lib, grouped)
    y = torch.empty(x.shape[0], blocks.shape[0])
    status = (lib or kernel()).lb_linear_bits(TYPE_IDS[type_name], GROUPED if grouped else ROWS, blocks.data_ptr(),
                                              blocks.shape[0], x.shape[1], x.data_ptr(), x.shape[0], y.data_ptr(),
                                              threads or torch.get_num_threads(), bits)
    if status:
        raise failed(status, type_name, blocks.shape[0], x.shape[1])
    return y

"""The read bandwidth a decode step is held to: the fastest plain read of a buffer larger than the
last-level cache, on the benchmark's threads.

A float32 matrix-vector product (MKL's sgemv, decode_limits.stream_rate) does arithmetic per byte
and is no plain read: the block kernel can stream its weights faster. So this also times a plain
read in C, compiled here on first use with the kernel's compiler and flags (an XOR over 64-bit
words, which the compiler vectorizes; OpenMP threads, each a contiguous share, as the kernel
splits its rows), and takes the faster of the two. Where no C compiler works, the sgemv alone,
and `read_rate` says so.
"""

from __future__ import annotations

import ctypes
import functools
import tempfile
from pathlib import Path

import torch

from benchmarks.decode_limits import stream_rate
from llamablock.util.timing import time_calls

SOURCE = r"""
#include <stddef.h>
#include <stdint.h>
uint64_t read_all(const uint64_t *p, size_t n, int threads) {
    uint64_t acc = 0;
#pragma omp parallel for num_threads(threads) reduction(^ : acc) schedule(static)
    for (size_t i = 0; i < n; i++) acc ^= p[i];
    return acc;
}
"""


@functools.cache
def _library() -> ctypes.CDLL | None:
    from llamablock.fast.kernels import build

    cc = build.compiler("c")
    if cc is None:
        return None
    with tempfile.TemporaryDirectory(prefix="llamablock-read-") as folder:  # loaded, the library outlives its file
        work = Path(folder)
        (work / "read.c").write_text(SOURCE)
        try:
            build.run([cc, *build.flags(), str(work / "read.c"), "-o", str(work / "read.so")])
        except RuntimeError:
            return None
        lib = ctypes.CDLL(str(work / "read.so"))
    lib.read_all.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    lib.read_all.restype = ctypes.c_uint64
    return lib


def read_rate(mib: int = 1024, repeats: int = 7) -> tuple[float, str]:
    """(bytes per second, how): the faster of a C plain read and MKL's sgemv over `mib` MiB (best of
    `repeats` each), on torch's threads."""
    rate, how = stream_rate(mib, repeats), "a float32 matrix-vector product (MKL)"
    lib = _library()
    if lib is None:
        return rate, how + "; no C compiler for a plain read"
    words = torch.ones(mib * 2**20 // 8, dtype=torch.int64)
    threads = torch.get_num_threads()
    t = time_calls({"read": lambda: lib.read_all(words.data_ptr(), words.numel(), threads)}, repeats=repeats,
                   warmup=2)["read"]["min"]
    read = words.numel() * 8 / t
    return (read, "a C read of 64-bit words") if read >= rate else (rate, how)

"""Keep glibc from returning large tensor buffers to the system and faulting them back in.

glibc's malloc serves every block above M_MMAP_THRESHOLD (128 KiB, raised dynamically to at
most 32 MiB on 64-bit) with its own mmap and unmaps it on free. A PyTorch CPU op that allocates
a large output each call therefore gets fresh pages every time, and the kernel zero-fills and
faults them in page by page, which can cost more than the op itself: LayerNorm over a
(2048, 4096) float32 tensor (a 32 MiB output per call) runs several times faster with
`MALLOC_MMAP_MAX_=0 MALLOC_TRIM_THRESHOLD_=68719476736` than with glibc's defaults.
`llamablock bench malloc` measures it.

`tune_allocator()` makes the same two settings through `mallopt(3)` at run time, so users need
not set variables: no mmap for large blocks (they come from the heap and are reused after free)
and no trimming of the heap top below 2 GiB (mallopt takes a C int, so 2^31 - 1 is its largest
value; the environment variable accepts more). Memory freed stays with the process for reuse,
which is the point; it is not leaked. A loader turns the mappings back on while it builds a
model (`mapped_large_blocks`), where holes would otherwise add up.

It is applied by the command line's entry point (`llamablock.cli.main`), never on
`import llamablock`: a library should not change its host process's allocator behind its back.
A program embedding llamablock may call `tune_allocator()` itself. It does nothing (and says
so) when the C library is not glibc, when another allocator (tcmalloc, jemalloc, mimalloc) is
preloaded, or when the user already set either MALLOC_ variable: their choice wins.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import os

# mallopt parameters, from glibc's <malloc.h>.
M_TRIM_THRESHOLD = -1
M_MMAP_MAX = -4
TRIM_THRESHOLD = 2**31 - 1  # largest C int: mallopt(int param, int value)
MMAP_MAX_DEFAULT = 65536  # glibc's default M_MMAP_MAX (DEFAULT_MMAP_MAX)
ENV_VARS = ("MALLOC_MMAP_MAX_", "MALLOC_TRIM_THRESHOLD_")
OTHER_ALLOCATORS = ("tcmalloc", "jemalloc", "mimalloc")

_state: str | None = None  # what the last call did, for `allocator_state()`
_mmap_off = False  # whether `tune_allocator` turned glibc's mmap of large blocks off


def _glibc():
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        libc = ctypes.CDLL(name)
    except OSError:
        return None
    # gnu_get_libc_version exists only in glibc (musl and others lack it).
    if not hasattr(libc, "gnu_get_libc_version") or not hasattr(libc, "mallopt"):
        return None
    libc.mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    libc.mallopt.restype = ctypes.c_int
    return libc


def tune_allocator() -> str:
    """Apply the settings if they apply here; return a one-line account of what was done."""
    global _state, _mmap_off
    preload = os.environ.get("LD_PRELOAD", "")
    if any(a in preload for a in OTHER_ALLOCATORS):
        _state = f"left alone: another allocator is preloaded ({preload})"
    elif any(v in os.environ for v in ENV_VARS):
        _state = "left alone: the user set " + ", ".join(v for v in ENV_VARS if v in os.environ)
    else:
        libc = _glibc()
        if libc is None:
            _state = "left alone: the C library is not glibc"
        else:
            ok = libc.mallopt(M_MMAP_MAX, 0) == 1 and libc.mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD) == 1
            _mmap_off = ok
            _state = ("glibc mallopt: M_MMAP_MAX=0, M_TRIM_THRESHOLD=2^31-1" if ok
                      else "glibc mallopt refused the settings; defaults kept")
    return _state


@contextlib.contextmanager
def mapped_large_blocks():
    """Within the block, blocks above the mmap threshold get their own mappings again, where
    `tune_allocator` had turned that off (elsewhere it changes nothing).

    A loader that builds long-lived tensors between short-lived temporaries fragments the heap:
    a weight lands in the hole a temporary left, the next temporaries no longer fit there, and
    the heap grows by about a tensor's temporaries per tensor until trimmed, while trimming
    after every tensor walks the whole heap each time. Own mappings go back to the system when
    freed, so the load's resident set stays at the weights built so far plus one tensor's
    temporaries. `llamablock bench memory` measures the peak.
    """
    libc = _glibc() if _mmap_off else None
    if libc is not None:
        libc.mallopt(M_MMAP_MAX, MMAP_MAX_DEFAULT)
    try:
        yield
    finally:
        if libc is not None:
            libc.mallopt(M_MMAP_MAX, 0)


def allocator_state() -> str:
    """What `tune_allocator` did in this process, or that it was not called."""
    return _state or "glibc defaults (tune_allocator was not called)"


def release_free_memory() -> bool:
    """Hand the free parts of glibc's heap back to the system now (malloc_trim(0)); False where
    the C library is not glibc. A loader that builds many long-lived tensors between short-lived
    temporaries leaves the heap full of freed holes, which the process keeps until trimmed."""
    libc = _glibc()
    if libc is None or not hasattr(libc, "malloc_trim"):
        return False
    libc.malloc_trim.argtypes = [ctypes.c_size_t]
    libc.malloc_trim(0)
    return True

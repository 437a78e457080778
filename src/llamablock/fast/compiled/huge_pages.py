"""2 MiB pages under the weights a decode step reads (Linux transparent huge pages).

Decoding one token reads every weight once (module section 15.5). With the usual 4 KiB pages
that stream crosses a page boundary, and needs another TLB entry, every 4 KiB: about 131,000
pages per token for SmolLM2 in float32 (538 MB of weights), about 33,000 in q8. When
/sys/kernel/mm/transparent_hugepage/enabled is `madvise`, Linux backs memory with 2 MiB pages
only where a process asks, and neither PyTorch nor AOTInductor asks, so a llamablock process
otherwise has no huge pages under its weights (AnonHugePages stays 0 kB). Asking for them
under the compiled step's weights helps most when the machine streams memory slowly and is
within noise when it does not; `llamablock bench huge_pages` measures it side by side.

`collapse(ranges)` marks each address range MADV_HUGEPAGE and asks the kernel to move what is
already there into 2 MiB pages now (MADV_COLLAPSE, Linux 6.1 on). It copies the memory, so it
costs time in proportion to the bytes moved, once at load. Only the whole 2 MiB pages inside a
range change; nothing else about the memory does.
Where the kernel refuses (no MADV_COLLAPSE, THP `never`, no free 2 MiB pages), the memory keeps
its small pages and everything works as before: the function reports bytes, never raises.

`tensor_ranges(tensors)` gives the address ranges of tensors, including oneDNN's opaque ones
(inductor's frozen weights are often those): AOTInductor copies a program's weights into one
malloc'd block when the library is loaded (aoti_runtime/model_base.h, `load_constants`) and makes
each constant a view of it, so the ranges of `runner.extract_constants_map()` cover that block.
Over a file's blocks the programs hold no copy (aoti_step.SHARED_WEIGHT_FORMATS): the ranges are the
static layout's own tensors, and only the whole 2 MiB pages inside each tensor move.
"""

from __future__ import annotations

import ctypes
import ctypes.util
from pathlib import Path

HUGE = 2 << 20  # bytes in a transparent huge page on x86-64 and arm64 (4 KiB base pages)
MADV_HUGEPAGE, MADV_COLLAPSE = 14, 25  # <asm-generic/mman-common.h>


def _libc():
    name = ctypes.util.find_library("c")
    if name is None or not Path("/proc/self/smaps_rollup").exists():  # Linux only
        return None
    try:
        libc = ctypes.CDLL(name, use_errno=True)
    except OSError:
        return None
    libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    libc.madvise.restype = ctypes.c_int
    return libc


def collapse(ranges: list[tuple[int, int]]) -> int:
    """Ask for 2 MiB pages under each [start, end) address range; return the bytes moved into
    them now (0 where the kernel refused, or outside Linux)."""
    libc = _libc()
    if libc is None:
        return 0
    done = 0
    for start, end in ranges:
        lo, hi = -(-start // HUGE) * HUGE, end // HUGE * HUGE  # the whole huge pages inside
        if hi <= lo:
            continue
        libc.madvise(lo, hi - lo, MADV_HUGEPAGE)  # later faults here get huge pages, khugepaged may collapse
        if libc.madvise(lo, hi - lo, MADV_COLLAPSE) == 0:
            done += hi - lo
    return done


def tensor_ranges(tensors) -> list[tuple[int, int]]:
    """[start, end) of each tensor's memory (strided or oneDNN), merged where they touch or overlap."""
    import torch

    spans = []
    for t in tensors:
        if t.is_mkldnn:
            start, size = torch.ops.mkldnn.data_ptr(t), torch.ops.mkldnn._nbytes(t)
        else:
            extent = 1 + sum((n - 1) * stride for n, stride in zip(t.shape, t.stride(), strict=True))  # elements spanned
            start, size = t.data_ptr(), extent * t.element_size() if t.numel() else 0
        if size > 0:
            spans.append((start, start + size))
    merged: list[list[int]] = []
    for start, end in sorted(spans):
        if merged and start <= merged[-1][1] + 64:  # AOTInductor aligns each constant to 64 bytes
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return [(a, b) for a, b in merged]


def huge_bytes() -> int:
    """AnonHugePages of this process in bytes (/proc/self/smaps_rollup), 0 where unknown."""
    try:
        for line in Path("/proc/self/smaps_rollup").read_text().splitlines():
            if line.startswith("AnonHugePages:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0

"""Read the 4-bit ids back out of the CPU int4 kernel's packed weight.

`aten._convert_weight_to_int4pack_for_cpu(q (n, k) int32, 1)` returns n * k / 2 bytes: the rows in
blocks of BLOCK_N, each block stored k-major, two ids per byte (PyTorch's
aten/src/ATen/native/cpu/int4mm_kernel.cpp, `weight_to_int4pack_kernel`):

    packed bytes, viewed (n / BLOCK_N, k, BLOCK_N / 2)
    "halves" (AVX-512, AVX2, whole blocks): low nibble = row j, high nibble = row j + BLOCK_N / 2
    "pairs"  (other CPUs, and a last block shorter than BLOCK_N): low = row 2j, high = row 2j + 1
    BLOCK_N = 4 floats of the build's vector width: 64 with AVX-512, 32 with AVX2 or none

Int4Linear's prefill path needs the ids in (n, k) order; reading them from the packed copy,
instead of keeping a second nibble copy of the same ids, saves half a byte per weight. The
layout is PyTorch's private choice, so `layout()` does not assume it: it packs a sample matrix
once per process and keeps the first (BLOCK_N, style) that reads it back exactly, or None, and
Int4Linear then keeps its own nibble copy as before. `llamablock bench memory` measures the
memory, tests/fast/kernels/test_quant.py the read-back.
"""

from __future__ import annotations

import functools

import torch

CANDIDATES = ((64, "halves"), (32, "halves"), (64, "pairs"), (32, "pairs"), (16, "pairs"))


def _split(b: torch.Tensor, style: str) -> torch.Tensor:
    """(m, rows/2, k) bytes -> (m * rows, k) ids: "halves" puts the low nibbles' rows first, "pairs"
    interleaves them (low nibble = even row)."""
    lo, hi = b & 15, b >> 4
    ids = torch.cat((lo, hi), dim=1) if style == "halves" else torch.stack((lo, hi), dim=2)
    return ids.reshape(-1, b.shape[-1])


def unpack(packed: torch.Tensor, n: int, k: int, block: int, style: str) -> torch.Tensor:
    """(n, k) uint8 ids in 0..15 from the kernel's packed bytes, laid out as (block, style) say.
    The bytes are transposed to row order before their nibbles are split: half the data to move."""
    flat = packed.reshape(-1)
    full = n // block
    head = flat[: full * k * block // 2].view(full, k, block // 2).transpose(1, 2).contiguous()  # (blocks, block/2, k)
    parts = [_split(head, style)]
    if n > full * block:  # the last, shorter block is always in pairs
        tail = flat[full * k * block // 2:].view(k, (n - full * block) // 2).T.contiguous()  # (rest/2, k)
        parts.append(_split(tail[None], "pairs"))
    return torch.cat(parts) if len(parts) > 1 else parts[0]


@functools.cache
def layout() -> tuple[int, str] | None:
    """(BLOCK_N, style) of this PyTorch build and CPU, checked on a sample; None when no candidate reads
    the sample back (a future layout), so that callers keep their own copy of the ids."""
    g = torch.Generator().manual_seed(0)
    n, k = 3 * 64 + 48, 64  # whole blocks of every candidate, and a shorter last block
    q = torch.randint(0, 16, (n, k), dtype=torch.int32, generator=g)
    try:
        packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q, 1)
    except (RuntimeError, AttributeError):
        return None
    if packed.dtype != torch.uint8 or packed.numel() * 2 != n * k:
        return None
    for block, style in CANDIDATES:
        if torch.equal(unpack(packed, n, k, block, style), q.to(torch.uint8)):
            return block, style
    return None


def readable(n: int, k: int) -> bool:
    """Whether an (n, k) weight's ids can be read back from its packed copy on this machine (the
    kernel itself takes rows in blocks of 16)."""
    return layout() is not None and n % 16 == 0 and k % 2 == 0

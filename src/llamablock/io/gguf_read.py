"""Reading a GGUF tensor's bytes into float rows (io/gguf.py loads models with these).

Each tensor is read a chunk of about a million values at a time, by read(2) at the offset the
reader's memory map gives it (`_read`): the block kernels of the `gguf` package expand the chunk
to float32, so neither the file nor a whole tensor in float32 is ever resident at once.
`llamablock bench memory` measures the peak of a load.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

# The quantization types this loader accepts: each is tested (tests/io/test_gguf.py).
SUPPORTED_TYPES = ("F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q4_K", "Q5_K", "Q6_K")


def _row_blocks(tensor):
    """(shape, [(first row, float32 rows), ...]) for one `ReaderTensor`, in PyTorch's (out, in) order.

    GGUF lists dimensions innermost first (`shape` [576, 192] is 192 rows of 576); the reader's
    `data` array is already in row-major (192, ...) order, so only the block bytes need expanding.
    gguf.quants.dequantize runs the format's block kernel on groups of 16 rows, a Python loop that
    would dominate the load; the same kernel (`dequantize_rows`) on ~1M-value chunks keeps the
    temporaries small at a fraction of the calls.
    """
    import gguf

    kind = tensor.tensor_type.name
    if kind not in SUPPORTED_TYPES:
        raise ValueError(f"tensor {tensor.name!r} has quantization type {kind}, which llamablock does not load; "
                         f"supported: {', '.join(SUPPORTED_TYPES)}")
    shape = tuple(int(n) for n in reversed(tensor.shape.tolist()))
    rows = tensor.data.reshape(shape[0], -1)
    step = max(1, (1 << 20) // shape[-1])
    plain = kind in ("F32", "F16")  # the reader already typed these
    convert = (lambda chunk: chunk.astype(np.float32)) if plain else getattr(gguf.quants, kind).dequantize_rows
    mapped = _mapping(rows)
    return shape, ((i, _read(rows[i:i + step], convert, mapped)) for i in range(0, shape[0], step))


def _mapping(array: np.ndarray):
    """(file name, the file offset of the mapping's first byte, its address) for the read-only
    np.memmap that `array` views, else None."""
    base = array
    while base is not None and not (isinstance(base, np.memmap) and base.mode == "r"):  # views of views
        base = getattr(base, "base", None)
    if base is None or getattr(base, "filename", None) is None:
        return None
    return base.filename, int(base.offset), base.ctypes.data


def _read(chunk: np.ndarray, convert, mapped) -> np.ndarray:
    """convert(chunk), a new array, with the chunk's bytes read from the file by read(2) into a
    buffer of its own rather than through the reader's mapping: pages read through a mapping count
    in this process's resident set (and its peak) until unmapped, so a whole model read that way
    holds the file's size beside the weights built from it. Dropping them after the fact
    (MADV_DONTNEED) is not reliable: where the page cache holds the file in large folios (a file
    just written, as a fresh install's is), faults map and keep far more than the chunk. Read this
    way, the file's pages are never mapped (`llamablock bench memory`)."""
    if mapped is None or not chunk.flags.c_contiguous:
        return convert(chunk)
    name, offset, address = mapped
    with open(name, "rb") as f:
        data = np.fromfile(f, dtype=chunk.dtype, count=chunk.size, offset=offset + chunk.ctypes.data - address)
    return convert(data.reshape(chunk.shape))


def dequantize(tensor) -> np.ndarray:
    """One `ReaderTensor` as a float32 array in PyTorch's (out, in) order."""
    shape, blocks = _row_blocks(tensor)
    out = np.empty(shape, dtype=np.float32)
    for i, block in blocks:
        out[i:i + len(block)] = block.reshape(len(block), *shape[1:])
    return out


class RowChunks:
    """One `ReaderTensor` not read yet: its `shape`, and, iterated, its rows in `dtype` a chunk at a
    time as (first row, rows). A consumer that converts rows independently (Int8Linear) then never
    holds the tensor whole, in float or in `dtype`."""

    def __init__(self, tensor, dtype: torch.dtype):
        self.tensor, self.dtype = tensor, dtype
        self.shape = torch.Size(int(n) for n in reversed(tensor.shape.tolist()))

    def __iter__(self):
        _, blocks = _row_blocks(self.tensor)
        for i, block in blocks:
            yield i, torch.from_numpy(block.reshape(len(block), *self.shape[1:])).to(self.dtype)


def dequantize_to(tensor, dtype: torch.dtype) -> torch.Tensor:
    """One `ReaderTensor` as a torch tensor of `dtype`, converted a chunk of rows at a time, so a
    bfloat16 load never holds the whole tensor in float32 (the same values as dequantize().to(dtype))."""
    chunks = RowChunks(tensor, dtype)
    out = torch.empty(chunks.shape, dtype=dtype)
    for i, rows in chunks:
        out[i:i + len(rows)] = rows
    return out


@dataclass(frozen=True)
class Blocks:
    """A quantized tensor's bytes exactly as the file stores them (fast/kernels/file_blocks.py computes with
    them): `rows` (n, bytes per row) uint8, one row of blocks per output row; `shape` the weights'
    (n, k), which loaders check against the model's."""

    type_name: str
    rows: torch.Tensor
    shape: torch.Size


def read_blocks(tensor) -> Blocks:
    """One `ReaderTensor`'s bytes, read by read(2) as `_read` reads them (never through the mapping)."""
    shape = torch.Size(int(n) for n in reversed(tensor.shape.tolist()))
    rows = tensor.data.reshape(shape[0], -1)
    data = _read(rows, lambda chunk: chunk, _mapping(rows))
    if data is rows or not data.flags.writeable:  # not read from a file: a copy of our own
        data = data.copy()
    return Blocks(tensor.tensor_type.name, torch.from_numpy(data), shape)


class TensorIndex:
    """What loading weights needs of an open `gguf.GGUFReader`, kept without the reader: the
    architecture, and each tensor's name, type, GGUF shape and bytes (`tensors`, as the reader's).

    Parsing the header makes several Python objects per vocabulary entry; freed, they leave
    the allocator's arenas pinned by the reader's surviving objects until the reader goes too.
    Built after `drop_array_fields`, the index lets the caller drop the reader before any weight
    is read. Its byte views are over a fresh read-only mapping that nothing has touched, and are
    read by `_read` (read(2)), not through it (`llamablock bench memory` measures the peak)."""

    def __init__(self, reader, architecture: str):
        from types import SimpleNamespace

        self.architecture = architecture
        file = np.memmap(_mapping(reader.data)[0], mode="r").view(np.ndarray)  # plain: slicing runs no Python hook
        self.tensors = [SimpleNamespace(name=str(t.name), tensor_type=t.tensor_type, shape=t.shape.copy(),
                                        data=file[t.data_offset:t.data_offset + t.n_bytes]
                                        .view(t.data.dtype).reshape(t.data.shape))
                        for t in reader.tensors]

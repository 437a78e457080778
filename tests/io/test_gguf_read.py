"""io/gguf_read.py: rows read a chunk at a time, and the file's pages leave the process once read.

Reference for the pages: Linux's /proc/self/smaps, whose Rss line per mapping counts the pages of
that mapping resident in this process (the page cache itself is not counted).
"""

from __future__ import annotations

import os
import weakref

import gguf
import numpy as np
import torch

from llamablock.io.gguf import (
    RowChunks,
    dequantize,
    dequantize_to,
    open_gguf,
    tensor_index,
)
from llamablock.io.resolve import resolve_model


def _resident_kib(path: str) -> int:
    """Resident KiB of this process's mappings of `path`."""
    total, current = 0, None
    with open("/proc/self/smaps") as f:
        for line in f:
            parts = line.split()
            if ":" not in parts[0] or not line[0].isupper():  # a mapping's header line
                current = parts[5] if len(parts) > 5 else None
            elif parts[0] == "Rss:" and current == path:
                total += int(parts[1])
    return total


def test_reading_a_tensor_leaves_its_pages_unmapped():
    path = str(resolve_model(None))
    reader = open_gguf(path)
    embed = next(t for t in reader.tensors if t.name == "token_embd.weight")  # the file's largest tensor
    assert embed.n_bytes > 16 * 2**20
    w = dequantize_to(embed, torch.bfloat16)
    # what stays mapped is the metadata the reader parsed, not the tensor's bytes
    assert _resident_kib(os.path.realpath(path)) * 1024 < min(embed.n_bytes / 8, embed.data_offset + 2**20)
    assert torch.equal(w, torch.from_numpy(dequantize(embed)).to(torch.bfloat16))  # and read again, equal


def test_row_chunks_cover_the_tensor_in_order():
    reader = open_gguf(resolve_model(None))
    t = next(t for t in reader.tensors if t.name == "blk.0.ffn_down.weight")
    chunks = RowChunks(t, torch.float32)
    whole = torch.from_numpy(dequantize(t))
    assert tuple(chunks.shape) == tuple(whole.shape)
    rows = 0
    for first, block in chunks:
        assert first == rows and torch.equal(block, whole[first:first + len(block)])
        rows += len(block)
    assert rows == whole.shape[0]


def test_the_tensor_index_reads_what_the_reader_reads_and_lets_it_go():
    path = str(resolve_model(None))
    reader = open_gguf(path)
    expected = [(t.name, t.tensor_type, t.shape.tolist(), t.data) for t in reader.tensors]
    index = tensor_index(reader)
    gone = weakref.ref(reader)
    del reader
    assert gone() is None  # nothing of the index keeps the reader (and its parse) alive
    assert index.architecture == "llama" and len(index.tensors) == len(expected)
    for t, (name, kind, shape, data) in zip(index.tensors, expected, strict=True):
        assert (t.name, t.tensor_type, t.shape.tolist(), t.data.shape, t.data.dtype) == (name, kind, shape, data.shape,
                                                                                        data.dtype)
    embed = index.tensors[0]  # the largest tensor, read by read(2) as the loaders read it
    assert embed.name == "token_embd.weight" and embed.data.nbytes > 16 * 2**20
    w = dequantize_to(embed, torch.float32)
    assert _resident_kib(os.path.realpath(path)) * 1024 < embed.data.nbytes / 8  # its pages were never mapped
    # the reference: the gguf package's own kernel on the reader's view of the same bytes
    assert torch.equal(w, torch.from_numpy(gguf.quants.dequantize(expected[0][3], expected[0][1])))
    for i in (len(expected) // 2, -1):  # the same bytes as the reader's, through the index's own mapping
        assert np.array_equal(index.tensors[i].data, expected[i][3])

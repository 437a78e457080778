"""Weights at the file's size: a quantized GGUF's run holds its tensors as the file stores them,
no float copy of any matrix. The case that used to break it is the one most 1B-class downloads
have: an untied embedding in a K type (Q4_K_M of TinyLlama-shaped models) or Q4_0, which was
read into a float32 table four to seven times its stored size. The files are written as
llama-quantize writes them (benchmarks/scaled_gguf.py MIXES), at a size where the embedding
dominates, so a float table would show at once.

Bound: the load's peak growth (a child process; tests/peak_memory.py) stays under the file's size
plus FIXED, what loading any file adds (the tokenizer built from the vocabulary, the library code
the load pages in, one tensor's temporaries), with a 10% margin on the file for the heap's holes.
A float32 embedding table alone would add 4 x vocabulary x width bytes, far above the bound.
"""

from __future__ import annotations

import os

import pytest
from peak_memory import peak_memory

from benchmarks.scaled_gguf import write_scaled
from llamablock.fast.machine import this_machine
from llamablock.io.resolve import resolve_model

FIXED = 64 * 2**20
WIDTH, LAYERS, HEADS, KV_HEADS, FFN = 1024, 4, 16, 4, 2816  # the embedding is about half the weights


@pytest.mark.slow
@pytest.mark.parametrize("mix", ["Q4_K_M", "Q4_0"])
def test_an_untied_quantized_embedding_loads_at_its_stored_size(tmp_path, mix):
    if not this_machine().kernel:
        pytest.skip(f"the block kernel does not build here ({this_machine().why_not})")
    f = write_scaled(resolve_model(None), tmp_path / f"{mix}.gguf", WIDTH, LAYERS, HEADS, KV_HEADS, FFN,
                     mix=mix, untied=True)
    size = os.path.getsize(f)
    load, _ = peak_memory(f)
    print(f"{mix}: load peak {load / 2**20:.0f} MiB for a {size / 2**20:.0f} MiB file")
    assert 0 < load <= 1.1 * size + FIXED, (load / 2**20, size / 2**20)

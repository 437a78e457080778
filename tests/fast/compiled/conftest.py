"""The tiny llama the compiled engines' tests share (two layers, 4 query and 2 key-value heads,
transformers' own initialisation), loaded once per test module."""

from __future__ import annotations

import pytest
from hf_reference import tiny_hf_model

import llamablock


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    d = tmp_path_factory.mktemp("tiny")
    tiny_hf_model("llama", n_heads=4, n_kv=2).save_pretrained(d)
    return llamablock.load_pretrained(d)

"""bench size's step profile (benchmarks/step_profile.py): the clocks see every block-kernel call
and every attention call of a decode step, the parts add up to the step, and the wrapped layers are
given back as they were. Times themselves are never asserted."""

from __future__ import annotations

import functools

import pytest
from gguf_tiny import write_tiny_gguf
from hf_reference import tiny_hf_model

from benchmarks.step_profile import profile, rows
from llamablock.fast.kernels import ggml_kernel
from llamablock.fast.kernels.file_blocks import BlockLinear
from llamablock.fast.machine import this_machine


def test_the_profile_clocks_every_kernel_and_attention_call(tmp_path, monkeypatch):
    if not this_machine().kernel:
        pytest.skip(f"the block kernel does not build here ({this_machine().why_not})")
    f = tmp_path / "q8.gguf"
    hf = tiny_hf_model("llama", n_heads=4, n_kv=2, hidden_size=64, intermediate_size=128, num_hidden_layers=2)
    write_tiny_gguf(f, hf, qtype="Q8_0")
    seen = []
    original = BlockLinear.__init__

    def record(self, *args, **kwargs):
        original(self, *args, **kwargs)
        seen.append(self)

    monkeypatch.setattr(BlockLinear, "__init__", record)
    prof = profile(f, 16, 4)
    decode = prof["decode"]
    own_embedding = 0 if hf.config.tie_word_embeddings else 1  # an untied embedding's blocks: read, never multiplied
    assert decode["block layers"] == len(seen) - own_embedding > 0
    assert decode["kernel calls"] == decode["block layers"]  # every block layer, once a step
    assert decode["attention calls"] == 2  # one per layer
    for part in prof.values():
        assert part["kernel"] > 0 and part["attention"] > 0
        assert part["kernel"] + part["attention"] + part["rest"] == pytest.approx(part["step"])
    # every binding back as the plan made it (its crossover bound in), none left wrapped in the clock
    assert all(isinstance(m.binding, functools.partial) and m.binding.func is ggml_kernel.matmul for m in seen)
    assert [r[1] for r in rows("Q8_0", prof, 16)] == ["decode step at position 16", "prefill of 16"]

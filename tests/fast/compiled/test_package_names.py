"""A compiled package's name does not depend on whether the block kernel loaded in this process.

Package names once held whether the kernel loaded (the rows' layout, read from the process), so a
damaged kernel library hid every compiled build of every format, float32 included, and `generate`
compiled again in the foreground. Now the name holds the plan's layout (builds.weights_identity),
which only the file's own blocks have: every other format is named the same with or without it.
"""

from __future__ import annotations

import pytest

from llamablock.fast.compiled import builds
from llamablock.fast.kernels import ggml_kernel
from llamablock.fast.machine import machine_for
from llamablock.fast.plan import decide
from llamablock.io.source import ModelSource
from llamablock.presets import preset
from llamablock.util.cpu import CPU

AVX512 = CPU("sim", 2, "AVX512", frozenset({"avx512_f"}))
Q4_1_TIED = {"token_embd.weight": "Q8_0", "blk.0.attn_q.weight": "Q4_1", "blk.0.ffn_down.weight": "Q4_1"}
F32_ONLY = {"token_embd.weight": "F32", "output.weight": "F32", "blk.0.attn_q.weight": "F32"}


def _name(path, stored, fmt, kernel: bool, monkeypatch):
    """The weights' part of the package name that plan.build gives the compiled engine of `fmt`, on
    a machine where the kernel loaded or not (in the plan's record and in this process)."""
    monkeypatch.setattr(builds, "built_length", lambda *a, **k: 512)
    monkeypatch.setattr(builds, "autotuned", lambda *a: True)
    monkeypatch.setattr(ggml_kernel, "kernel", (lambda: object()) if kernel else (lambda: None))
    source = ModelSource(None, path, "gguf", preset("llama-2024-small", max_seq_len=512), stored, where="model.gguf")
    plan = decide(source, fmt, "compiled", machine=machine_for(AVX512, kernel, "the kernel library is damaged"))
    return builds.weights_identity(path, plan.fmt, plan.grouped), (plan.fmt, plan.autotune, plan.batch, plan.prefill)


@pytest.mark.parametrize("stored,fmt", [(Q4_1_TIED, "float32"), (Q4_1_TIED, "bfloat16"), (Q4_1_TIED, "q8"),
                                        (Q4_1_TIED, "q4"), (F32_ONLY, "auto")])
def test_a_package_is_named_the_same_whether_or_not_the_kernel_loaded(tmp_path, monkeypatch, stored, fmt):
    path = tmp_path / "model.gguf"
    path.write_bytes(b"GGUF")
    loaded = _name(path, stored, fmt, True, monkeypatch)
    broken = _name(path, stored, fmt, False, monkeypatch)
    assert loaded == broken and loaded[0] is not None

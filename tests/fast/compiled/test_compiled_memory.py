"""The compiled engine over a file's blocks holds the weights once: its programs read the static
layout's tensors (aoti_step.SHARED_WEIGHT_FORMATS) and the static layout's fused matrices are the
model's rows (static_decode.share_rows), where each program used to carry its own copy and the
fused q/k/v and gate/up were a second one (a 1B file's compiled run held about 6x the file:
`llamablock bench size`).

Bound for the peak: a process that loads the compiled programs from the disk cache and decodes
grows (VmHWM over the interpreter with torch) by at most the eager load's bound in
tests/fast/kernels/test_file_size.py, 1.1x the file plus FIXED; one more copy of the weights per
program, as before, would add the file's size twice.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from benchmarks.scaled_gguf import write_scaled
from llamablock.fast.machine import this_machine
from llamablock.io.resolve import resolve_model

FIXED = 64 * 2**20  # as tests/fast/kernels/test_file_size.py: what loading any file adds
WIDTH, LAYERS, HEADS, KV_HEADS, FFN = 1024, 2, 16, 4, 4096

RUN = r"""
import json, sys, torch
torch.set_num_threads(1)
from llamablock.fast.compiled.aoti_engine import AOTIEngine
from llamablock.fast.plan import load_gguf_native
from llamablock.runtime.generate import generate

def kib(field):
    return next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith(field + ":"))

open("/proc/self/clear_refs", "w").write("5")  # the peak (VmHWM) afresh from here
before = kib("VmRSS")
model, _ = load_gguf_native(sys.argv[1], engine="compiled")
engine = AOTIEngine(model, "blocks", autotune=False)
tokens = generate(engine, list(range(5, 45)), 8, eos_ids=()).tokens
print(json.dumps([engine.compile_seconds, (kib("VmHWM") - before) * 1024]))
"""


@pytest.mark.slow
def test_the_compiled_programs_add_no_copy_of_the_weights(tmp_path):
    if not this_machine().kernel:
        pytest.skip(f"the block kernel does not build here ({this_machine().why_not})")
    f = write_scaled(resolve_model(None), tmp_path / "Q4_K_M.gguf", WIDTH, LAYERS, HEADS, KV_HEADS, FFN, mix="Q4_K_M")
    size = os.path.getsize(f)
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "cache")}
    runs = []
    for _ in range(2):  # the first compiles (inductor's own memory); the second loads, as `generate` does
        r = subprocess.run([sys.executable, "-c", RUN, str(f)], env=env, capture_output=True, text=True)
        assert r.returncode == 0, r.stderr[-2000:]
        runs.append(json.loads(r.stdout.splitlines()[-1]))
    (compiled, _), (loaded, peak) = runs
    print(f"compiled programs loaded: peak growth {peak / 2**20:.0f} MiB for a {size / 2**20:.0f} MiB file")
    assert compiled > 0 and loaded == 0
    assert 0 < peak <= 1.1 * size + FIXED, (peak / 2**20, size / 2**20)


def test_the_fused_matrices_are_the_model_s_rows(tmp_path):
    """share_rows: after the static layout is built, the model's q/k/v and gate/up blocks are views of
    its fused tensors (no second copy), with the bytes they had; a longer cache reuses the layers."""
    from llamablock.fast.compiled.static_engine import StaticEngine
    from llamablock.fast.plan import load_gguf_native

    f = write_scaled(resolve_model(None), tmp_path / "Q4_0.gguf", 256, 2, 4, 2, 512, mix="Q4_0")
    model, _ = load_gguf_native(f, engine="compiled")
    attn, ffn = model.layers[0].attn, model.layers[0].ffn
    before = [m.blocks.clone() for m in (attn.wq, attn.wk, attn.wv, ffn.w_gate, ffn.w_up)]
    engine = StaticEngine(model, "blocks")
    engine.start(64)
    layer = engine.static.layers[0]
    for fused, parts in ((layer.wqkv, (attn.wq, attn.wk, attn.wv)), (layer.ffn.w_gate_up, (ffn.w_gate, ffn.w_up))):
        base = fused.blocks.untyped_storage().data_ptr()
        assert all(p.blocks.untyped_storage().data_ptr() == base for p in parts)
    after = [m.blocks for m in (attn.wq, attn.wk, attn.wv, ffn.w_gate, ffn.w_up)]
    assert all(torch.equal(a, b) for a, b in zip(before, after, strict=True))
    layers = engine.static.layers
    engine.start(2 * engine.length)  # a longer cache: new slots, the same fused weights
    assert engine.static.layers is layers

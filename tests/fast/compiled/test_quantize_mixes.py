"""The mixes of types llama-quantize writes, run as stored in both engines: Q4_K_M (Q4_K layers,
Q6_K for attn_v, ffn_down and the head), Q4_0 with a Q6_K output matrix (what it writes for every
Q4_0 file), and Q8_0. For each, the default plan keeps every matrix as the file's blocks, and the
compiled engine (its blocks calling the kernel as an operator) gives the eager engine's logits.

Tolerance: both engines compute the same integer block sums; the compiled program reorders the
float32 work around them (norms, attention, the sums of a fused layer), so the logits agree to
1e-4 of their largest magnitude, the bound test_compiled_blocks.py uses for Q4_1 files scaled to
these sizes. Greedy tokens must be equal. Both plans keep the KV cache in float32 (`kv="float32"`):
rounding to a 16-bit cache turns the engines' float32 differences into whole 16-bit steps now and
then, a bound of its own (tests/kv16_bound.py, tests/fast/compiled/test_kv_dtype_compiled.py), which
would hide the differences of weights this test is here to catch.
"""

from __future__ import annotations

import pytest
import torch
from gguf_tiny import random_kquant_blocks, write_tiny_gguf
from hf_reference import tiny_hf_model

from llamablock.fast.machine import this_machine
from llamablock.fast.plan import build, decide
from llamablock.io.source import open_source
from llamablock.runtime.generate import generate

D, KV = 256, 128  # model width and the k/v projections' rows (n_kv 2 x head_dim 64)
SHAPES = {"attn_q": (D, D), "attn_k": (KV, D), "attn_v": (KV, D), "attn_output": (D, D), "ffn_gate": (D, D),
          "ffn_up": (D, D), "ffn_down": (D, D)}
MIXES = {  # a layer matrix's type by its GGUF name (llama.cpp's llama-quantize, llama_tensor_get_type)
    "Q4_K_M": {**dict.fromkeys(SHAPES, "Q4_K"), "attn_v": "Q6_K", "ffn_down": "Q6_K", "output": "Q6_K"},
    "Q4_0": {**dict.fromkeys(SHAPES, None), "output": "Q6_K"},  # None: the file's qtype, Q4_0
    "Q8_0": dict.fromkeys(SHAPES, None),
}


def _mix(tmp_path, name: str):
    hf = tiny_hf_model("llama", n_heads=4, n_kv=2, hidden_size=D, intermediate_size=D, head_dim=64,
                       max_position_embeddings=128, vocab_size=256)
    raw = {}
    for i, (part, kind) in enumerate(MIXES[name].items()):
        if kind is not None:
            rows, cols = SHAPES.get(part, (256, D))  # the output head: vocabulary x width
            gguf_name = "output.weight" if part == "output" else f"blk.0.{part}.weight"
            raw[gguf_name] = (random_kquant_blocks(kind, rows, cols, seed=i), kind)
    f = tmp_path / f"{name}.gguf"
    write_tiny_gguf(f, hf, qtype="Q8_0" if name == "Q4_K_M" else name, raw_blocks=raw)
    return f


@pytest.mark.slow
@pytest.mark.parametrize("name", list(MIXES))
def test_each_mix_runs_as_stored_in_both_engines(tmp_path, name):
    if not this_machine().kernel:
        pytest.skip(f"the block kernel does not build here ({this_machine().why_not})")
    source = open_source(_mix(tmp_path, name))
    eager_plan, compiled_plan = decide(source, "auto", "eager", kv="float32"), decide(source, "auto", "compiled", kv="float32")
    stored = set(source.stored.values())
    assert eager_plan.formats == dict.fromkeys(stored, "blocks") and eager_plan.head == "blocks"
    assert compiled_plan.fmt == "blocks" and compiled_plan.activations == "float32"
    eager, compiled = build(source, eager_plan).engine, build(source, compiled_plan).engine
    ids = torch.tensor([[1, 5, 7, 9, 11, 3, 2, 8] * 6])  # (1, 48)
    with torch.no_grad():
        eager.prepare(64)
        compiled.prepare(64)
        want, got = eager.prefill(ids), compiled.prefill(ids)
    assert compiled.running.get("prefill") not in (None, "eager"), compiled.running  # a compiled program ran
    torch.testing.assert_close(got, want, atol=1e-4 * want.abs().max().item(), rtol=0)
    prompt = ids[0, :12].tolist()
    assert generate(compiled, prompt, 8).tokens == generate(eager, prompt, 8).tokens

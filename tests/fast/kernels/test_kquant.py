"""fast/kernels/kquant.py: a Q4_K tensor's own ids in the int4 layer.

Reference: the `gguf` package's numpy dequantization of Q4_K (gguf.quants.dequantize), the
file's exact weights. The ids and group scales must reproduce it bit for bit; the packed layer
must stay within the bfloat16 rounding of its scale and zero (derived at `_bound`), which is what
re-deriving the groups (Int4Linear's own quantizer) does not do.
"""

from __future__ import annotations

import gguf
import pytest
import torch
from gguf_tiny import random_kquant_blocks, write_tiny_gguf
from hf_reference import tiny_hf_model

import llamablock
from llamablock.fast import machine
from llamablock.fast.kernels import ggml_kernel
from llamablock.fast.kernels.kquant import q4k_groups, q4k_linear
from llamablock.fast.kernels.quant import Int4Linear
from llamablock.fast.plan import load_gguf_native

BF16_U = 2.0**-8  # bfloat16's unit roundoff: 8 significant bits, rounded to nearest


def _exact(raw, n: int, k: int) -> torch.Tensor:
    return torch.from_numpy(gguf.quants.dequantize(raw, gguf.GGMLQuantizationType.Q4_K).reshape(n, k))


def test_the_ids_and_group_scales_are_the_files_weights_bit_for_bit():
    raw = random_kquant_blocks("Q4_K", 16, 512, seed=1)
    q, scale, offset = q4k_groups(torch.from_numpy(raw), 512)
    assert q.dtype == torch.uint8 and int(q.max()) <= 15
    got = scale.repeat_interleave(32, 1) * q.float() - offset.repeat_interleave(32, 1)
    assert torch.equal(got, _exact(raw, 16, 512))


def _bound(scale: torch.Tensor, offset: torch.Tensor) -> torch.Tensor:
    """Per weight (n, k): s = bf16(d sc) = d sc (1 + a), z = bf16(8 s - dmin m), |a|, |b| <= u; the kernel's
    (q - 8) s + z = q d sc (1 + a) - dmin m + b z, so it is off by at most u (15 d sc + |z|), plus a
    float32 rounding of each of its three operations."""
    s = scale.to(torch.bfloat16).float()
    z = (8 * s - offset).abs()
    per_group = BF16_U * (15 * scale.abs() + z) * 1.01 + 3 * 2.0**-24 * (15 * s + z)
    return per_group.repeat_interleave(32, 1)


def test_the_packed_layer_keeps_the_ids_and_is_closer_than_requantizing():
    raw = random_kquant_blocks("Q4_K", 16, 512, seed=2)
    exact = _exact(raw, 16, 512)
    q, scale, offset = q4k_groups(torch.from_numpy(raw), 512)
    layer = q4k_linear(torch.from_numpy(raw), 512)
    assert torch.equal(layer.ids(), q)
    err = (layer.unpacked() - exact).abs()
    assert (err <= _bound(scale, offset)).all()
    requantized = (Int4Linear(exact).unpacked() - exact).abs()
    assert err.mean() < requantized.mean() / 2


def test_a_q4_k_file_loads_its_ids(tmp_path, monkeypatch):
    """Where the block kernel did not build: a tiny model with one Q4_K matrix: the loaded layer
    holds the file's ids, and its logits
    follow the float32 loader's (the file dequantized by the gguf package) as closely as a
    bfloat16 model's."""
    hf = tiny_hf_model("llama", n_heads=4, n_kv=2, hidden_size=256, intermediate_size=256, head_dim=64)
    raw = random_kquant_blocks("Q4_K", 256, 256, seed=3)
    f = tmp_path / "q4k.gguf"
    write_tiny_gguf(f, hf, qtype="Q8_0", raw_blocks={"blk.0.ffn_down.weight": (raw, "Q4_K")})
    no_kernel = machine.this_machine().without_kernel("turned off by the test")
    monkeypatch.setattr(machine, "this_machine", lambda: no_kernel)
    native, used = load_gguf_native(f)
    assert used["Q4_K ids in q4"] == 1
    layer = native.layers[0].ffn.w_down
    assert isinstance(layer, Int4Linear)
    assert torch.equal(layer.ids(), q4k_groups(torch.from_numpy(raw), 256)[0])
    exact = llamablock.load_pretrained(f, torch.float32)
    assert torch.equal(exact.layers[0].ffn.w_down.weight, _exact(raw, 256, 256))


def test_with_the_kernel_each_k_type_loads_as_the_file_s_blocks(tmp_path):
    """Where the block kernel built, Q4_K, Q5_K and Q6_K matrices load as the file's own blocks: each
    layer's dequantization equals the float32 loader's weight (the gguf package's) bit for bit."""
    from llamablock.fast.kernels.file_blocks import BlockLinear

    if not machine.this_machine().kernel:
        pytest.skip(f"the block kernel does not build here ({machine.this_machine().why_not})")
    hf = tiny_hf_model("llama", n_heads=4, n_kv=2, hidden_size=256, intermediate_size=256, head_dim=64)
    names = {"Q4_K": "blk.0.ffn_down.weight", "Q5_K": "blk.0.ffn_up.weight", "Q6_K": "blk.0.ffn_gate.weight"}
    raw = {kind: random_kquant_blocks(kind, 256, 256, seed=i) for i, kind in enumerate(names)}
    f = tmp_path / "kquants.gguf"
    write_tiny_gguf(f, hf, qtype="Q8_0", raw_blocks={name: (raw[kind], kind) for kind, name in names.items()})
    native, used = load_gguf_native(f)
    exact = llamablock.load_pretrained(f, torch.float32)
    for kind, attr in zip(names, ("w_down", "w_up", "w_gate"), strict=True):
        assert used[f"{kind} blocks"] == 1
        layer = getattr(native.layers[0].ffn, attr)
        assert isinstance(layer, BlockLinear)  # Q4_K and Q5_K in groups of 8 rows where the build groups, Q6_K not
        assert layer.grouped == (kind in ggml_kernel.GROUPABLE and ggml_kernel.groups_rows())
        assert torch.equal(layer.dequantized(), getattr(exact.layers[0].ffn, attr).weight)

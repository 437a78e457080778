"""A GGUF's own Q4_0 / Q4_1 / Q8_0 blocks, kept (fast/kernels/file_blocks.py, fast/kernels/c/).

References, all independent of the code under test:
  * the `gguf` package's numpy dequantization (gguf.quants.dequantize): the blocks' exact weights,
    which `dequantize_blocks` and every loaded layer must reproduce bit for bit;
  * float64 products with those weights, against which the kernel must stay within the bound its
    16-bit activations imply (derived at `_bound`);
  * the float32 loader (`load_pretrained`, the file dequantized by the gguf package), whose weights
    the loaded model's must equal bit for bit, and whose logits its must follow closely.
"""

from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch
from gguf_tiny import write_tiny_gguf
from hf_reference import tiny_hf_model
from kernel_builds import RUNS  # the builds this CPU runs; conftest.py's `libs` builds each once
from torch import nn

import llamablock
from llamablock.fast.kernels import block_op, ggml_kernel
from llamablock.fast.kernels.file_blocks import BlockEmbedding, BlockLinear, dequantize_blocks, group_rows, ungroup_rows
from llamablock.fast.plan import load_gguf_native

TYPES = ("Q4_0", "Q4_1", "Q8_0")


def _random_blocks(type_name: str, n: int, k: int, seed: int = 0) -> np.ndarray:
    """Random bytes in every block, with finite float16 scales of every size, subnormals included:
    corners that weights quantized from normal values would not reach."""
    rng = np.random.default_rng(seed)
    bb = ggml_kernel.BLOCK_BYTES[type_name]
    b = rng.integers(0, 256, size=(n, k // 32, bb), dtype=np.uint8)
    halves = 2 if type_name == "Q4_1" else 1
    scales = rng.normal(size=(n, k // 32, halves)) * 10.0 ** rng.integers(-7, 3, size=(n, k // 32, halves))
    b[..., : 2 * halves] = scales.astype(np.float16).view(np.uint8).reshape(n, k // 32, 2 * halves)
    return b.reshape(n, k // 32 * bb)


@pytest.mark.parametrize("type_name", TYPES)
@pytest.mark.parametrize("source", ["quantized", "random bytes"])
def test_dequantize_equals_the_gguf_package_bit_for_bit(type_name, source):
    qtype = gguf.GGMLQuantizationType[type_name]
    if source == "quantized":  # rows of very different sizes, and a row of zeros
        w = np.random.default_rng(1).normal(size=(12, 96)) * np.logspace(-4, 3, 12)[:, None]
        w[3] = 0
        raw = gguf.quants.quantize(w.astype(np.float32), qtype)
    else:
        raw = _random_blocks(type_name, 12, 96)
    want = torch.from_numpy(gguf.quants.dequantize(raw, qtype).reshape(12, 96))
    got = dequantize_blocks(type_name, torch.from_numpy(raw.copy()))
    assert got.dtype == torch.float32 and torch.equal(got, want)




def _bound(w: torch.Tensor, x: torch.Tensor, bits: int = 16) -> torch.Tensor:
    """|kernel - x W^T| per output, for W (n, k) exact and x (m, k). The kernel multiplies W by x
    rounded to e * p, p an integer of 16 bits and e = (block max |x|) / 32767 per block of 32 (in
    8 bits, ggml_kernel.matmul's bits=8: e = (block max |x|) / 127, the same argument): each
    rounding moves x by at most e / 2, so the product by at most sum_blocks e / 2 * sum |w| over
    the block (1.01: e and 1/e are themselves rounded). The float32 arithmetic after the exact
    integer sums (a scale product, a fused multiply-add per block into one of two accumulators, the
    final sums) adds at most (blocks + 16) units of 2^-24 of sum |w| |x|."""
    m, k = x.shape
    e = x.abs().reshape(m, k // 32, 32).amax(-1).double() / (32767 if bits == 16 else 127)  # (m, blocks)
    w_blocks = w.abs().double().reshape(w.shape[0], k // 32, 32).sum(-1)  # (n, blocks)
    quantization = 1.01 * (e / 2) @ w_blocks.T  # (m, n)
    arithmetic = (k // 32 + 16) * 2.0**-24 * (x.abs().double() @ w.abs().double().T)
    return quantization + arithmetic


@pytest.mark.parametrize("type_name", TYPES)
def test_grouping_rows_is_a_reordering_of_the_file_bytes(type_name):
    """group_rows only moves bytes: undone, it gives the file's rows; and each group holds exactly its
    8 rows' bytes (a sorted comparison, independent of the order the kernel reads them in)."""
    raw = torch.from_numpy(_random_blocks(type_name, 24, 96, seed=5))
    grouped = group_rows(type_name, raw)
    assert grouped.shape == raw.shape and not torch.equal(grouped, raw)
    assert torch.equal(ungroup_rows(type_name, grouped), raw)
    for g in range(3):
        assert torch.equal(grouped[8 * g:8 * g + 8].flatten().sort().values, raw[8 * g:8 * g + 8].flatten().sort().values)


@pytest.mark.parametrize("type_name", TYPES)
@pytest.mark.parametrize("isa", list(ggml_kernel.ISAS))
@pytest.mark.parametrize("grouped", [False, True])
@pytest.mark.parametrize("bits", [16, 8])
def test_the_kernel_is_within_its_activation_bound(type_name, isa, grouped, bits, libs):
    """Both layouts in every build, activations in 16 bits and in 8: a misplaced byte of the grouped
    layout moves a product far past the bound, and so does x's low half skipped in 16 bits (the
    8-bit bound is 258 times the 16-bit one, so 16-bit x computed as 8-bit would pass only the former)."""
    if isa not in RUNS:
        pytest.skip(f"this CPU does not run the {isa} build")
    lib = libs[isa]
    raw = torch.from_numpy(_random_blocks(type_name, 40, 160, seed=2))
    w = dequantize_blocks(type_name, raw)
    g = torch.Generator().manual_seed(3)
    x = torch.randn(6, 160, generator=g) * torch.logspace(-3, 2, 160)  # blocks of very different sizes
    x[1, 32:64] = 0  # a block of zeros: its scale is 0
    x[5, 70] = 1e4  # one outlier dominates its block's scale
    blocks = group_rows(type_name, raw) if grouped else raw
    for rows in (x[:1], x):  # a decode step; prefill, four rows at a time and two alone
        got = ggml_kernel.matmul(type_name, blocks, rows, lib=lib, grouped=grouped, bits=bits).double()
        want, bound = rows.double() @ w.double().T, _bound(w, rows, bits)
        assert ((got - want).abs() <= bound).all(), ((got - want).abs() / bound).max()


@pytest.mark.parametrize("type_name", TYPES)
@pytest.mark.parametrize("isa", list(ggml_kernel.ISAS))
@pytest.mark.parametrize("bits", [16, 8])
def test_the_largest_integers_do_not_overflow(type_name, isa, bits, libs):
    """Every quant at its largest magnitude against activations all at +-32767 (8 bits: +-127): the
    sums the AVX2 build keeps in 16 bits (c/x86.c group_sums_q4, Q8_0's pairs in 8 bits) are at
    their largest, and must not wrap."""
    if isa not in RUNS:
        pytest.skip(f"this CPU does not run the {isa} build")
    lib = libs[isa]
    raw = torch.from_numpy(_random_blocks(type_name, 16, 64, seed=7)).reshape(16, 2, -1)
    head = 4 if type_name == "Q4_1" else 2
    raw[:8, :, head:] = 0xFF if type_name != "Q8_0" else 0x80  # nibbles 15 (Q4_0: 7); int8 -128
    raw[8:, :, head:] = 0x00  # nibbles 0 (Q4_0: -8); int8 0
    raw = raw.reshape(16, -1)
    w = dequantize_blocks(type_name, raw)
    x = torch.tensor([[-1.0] * 64, [1.0] * 64, [1.0, -1.0] * 32])  # every integer at +-32767
    for grouped in (False, True):
        got = ggml_kernel.matmul(type_name, group_rows(type_name, raw) if grouped else raw, x, lib=lib,
                                 grouped=grouped, bits=bits).double()
        assert ((got - x.double() @ w.double().T).abs() <= _bound(w, x, bits)).all(), (isa, grouped)


@pytest.mark.parametrize("isa", list(ggml_kernel.ISAS))
def test_tiny_activations_stay_within_the_bound_or_count_as_zero(isa, libs):
    """A block of 1e-30 still has a finite 1/e and keeps its bound; a block of 1e-40 (subnormal)
    has none and counts as zeros in every build (c/blocks.h lb_quantize_block), not as garbage integers."""
    if isa not in RUNS:
        pytest.skip(f"this CPU does not run the {isa} build")
    lib = libs[isa]
    raw = torch.from_numpy(_random_blocks("Q4_1", 16, 64, seed=8))
    w = dequantize_blocks("Q4_1", raw)
    x = torch.randn(2, 64, generator=torch.Generator().manual_seed(9))
    x[0] *= 1e-30
    x[1] *= 1e-40
    for grouped in (False, True):
        got = ggml_kernel.matmul("Q4_1", group_rows("Q4_1", raw) if grouped else raw, x, lib=lib, grouped=grouped)
        assert ((got[0].double() - x[0].double() @ w.double().T).abs() <= _bound(w, x[:1])[0]).all()
        assert torch.equal(got[1], torch.zeros(16)), (isa, grouped)


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_a_non_finite_activation_gives_nan_not_a_finite_number(bad):
    """fmaxf drops NaN and the integer rounding of NaN or infinity is undefined: without its check
    the kernel returned finite garbage for such a row, hiding the fault from the checks downstream."""
    raw = torch.from_numpy(_random_blocks("Q4_1", 8, 64))
    x = torch.randn(2, 64)
    x[1, 40] = bad
    y = ggml_kernel.matmul("Q4_1", raw, x)
    assert torch.isfinite(y[0]).all() and torch.isnan(y[1]).all()


@pytest.mark.parametrize("isa", list(ggml_kernel.ISAS))
@pytest.mark.parametrize("grouped", [False, True])
def test_a_row_is_the_same_alone_and_among_others(isa, grouped, libs):
    """Prefill takes rows four at a time and decode one: a token's result must not depend on which
    (a prompt's logits then do not depend on how it was split into steps), bit for bit."""
    if isa not in RUNS:
        pytest.skip(f"this CPU does not run the {isa} build")
    lib = libs[isa]
    for type_name in TYPES:
        raw = torch.from_numpy(_random_blocks(type_name, 24, 96, seed=4))
        raw = group_rows(type_name, raw) if grouped else raw
        x = torch.randn(69, 96)  # a tile of 64 (sixteen groups of four) and five more, four and one alone
        for bits in (16, 8):
            together = ggml_kernel.matmul(type_name, raw, x, lib=lib, grouped=grouped, bits=bits)
            alone = torch.cat([ggml_kernel.matmul(type_name, raw, x[i:i + 1], lib=lib, grouped=grouped, bits=bits)
                               for i in range(len(x))])
            assert torch.equal(together, alone), (type_name, bits)


@pytest.mark.parametrize("type_name", TYPES)
def test_a_grouped_layer_and_its_embedding_are_the_file_s_weights(type_name):
    """A layer that groups its rows computes as the file's order does, within the kernel's bound, and
    its dequantization and the embedding rows read from it are the file's, bit for bit."""
    raw = torch.from_numpy(_random_blocks(type_name, 24, 96, seed=6))
    plain = BlockLinear(type_name, raw, 96, grouped=False)
    grouped = BlockLinear(type_name, group_rows(type_name, raw), 96, grouped=True)
    assert grouped.grouped and not plain.grouped
    assert torch.equal(grouped.dequantized(), dequantize_blocks(type_name, raw))
    ids = torch.tensor([[0, 7, 8, 23], [15, 16, 3, 3]])
    assert torch.equal(BlockEmbedding(grouped)(ids), BlockEmbedding(plain)(ids))
    x = torch.randn(3, 96)
    want = x.double() @ plain.dequantized().double().T
    assert ((grouped(x).double() - want).abs() <= _bound(plain.dequantized(), x)).all()


def test_rows_not_in_groups_of_8_keep_the_file_order():
    raw = torch.from_numpy(_random_blocks("Q8_0", 12, 64))
    assert not BlockLinear("Q8_0", raw, 64).grouped
    with pytest.raises(ValueError, match="groups of 8"):
        BlockLinear("Q8_0", raw, 64, grouped=True)


def test_two_threads_compute_what_one_does():
    raw = torch.from_numpy(_random_blocks("Q4_1", 64, 128))
    x = torch.randn(2, 128)
    assert torch.equal(ggml_kernel.matmul("Q4_1", raw, x, threads=1), ggml_kernel.matmul("Q4_1", raw, x, threads=2))
    grouped = group_rows("Q4_1", raw[:40])  # 5 groups: shares of whole groups, some threads with none
    for threads in (3, 16):
        assert torch.equal(ggml_kernel.matmul("Q4_1", grouped, x, threads=threads, grouped=True),
                           ggml_kernel.matmul("Q4_1", grouped, x, threads=1, grouped=True)), threads


@pytest.mark.parametrize("isa", list(ggml_kernel.ISAS))
def test_each_build_s_block_table_is_gguf_s(isa, libs):
    """The C table (c/blocks.h LB_TYPE_TABLE) that every build exports gives the gguf package's
    (weights, bytes) for every kept type, and nothing for a type the kernel does not compute."""
    if isa not in RUNS:
        pytest.skip(f"this CPU does not run the {isa} build")
    lib = libs[isa]
    for name in ggml_kernel.KEPT:
        qtype = gguf.GGMLQuantizationType[name]
        assert (lib.lb_block_weights(qtype.value), lib.lb_block_bytes(qtype.value)) == gguf.GGML_QUANT_SIZES[qtype]
    assert lib.lb_block_bytes(gguf.GGMLQuantizationType.Q5_1.value) == 0


def _extremes(type_name: str, n: int, k: int) -> torch.Tensor:
    """Random blocks whose first half of rows has every quant at its largest magnitude."""
    raw = torch.from_numpy(_random_blocks(type_name, n, k, seed=11)).reshape(n, k // 32, -1)
    raw[: n // 2, :, 4 if type_name == "Q4_1" else 2:] = 0xFF if type_name != "Q8_0" else 0x80
    return raw.reshape(n, -1)


@pytest.mark.parametrize("grouped", [False, True])
def test_the_vnni_build_is_the_avx512_build_bit_for_bit(grouped, libs):
    """VNNI's dpwssd adds the same 16-bit products into the same int32 lanes as madd then add, and
    the float work around them is the same code: every output equal, prefill and decode."""
    if "avx512vnni" not in RUNS:
        pytest.skip("this CPU does not run the avx512vnni build (torch.cpu.get_capabilities: no avx512_vnni)")
    vnni, plain = libs["avx512vnni"], libs["avx512"]
    x = torch.randn(37, 160, generator=torch.Generator().manual_seed(12)) * torch.logspace(-3, 2, 160)
    x[3] = torch.tensor([1.0, -1.0]).repeat(80)  # every integer at +-32767
    for type_name in TYPES:
        raw = _extremes(type_name, 24, 160)
        blocks = group_rows(type_name, raw) if grouped else raw
        for rows in (x[:1], x[3:4], x):
            got = ggml_kernel.matmul(type_name, blocks, rows, lib=vnni, grouped=grouped)
            assert torch.equal(got, ggml_kernel.matmul(type_name, blocks, rows, lib=plain, grouped=grouped)), type_name


@pytest.mark.parametrize("grouped", [False, True])
def test_the_operator_and_the_ctypes_call_give_the_same_bits(grouped):
    """A layer's binding is either ggml_kernel.matmul or block_op.linear (fast/kernels/file_blocks.py):
    the same arguments give the same outputs, whichever the layer holds."""
    assert block_op.load(), block_op.why_not()
    x = torch.randn(37, 96, generator=torch.Generator().manual_seed(13))
    for type_name in TYPES:
        raw = _extremes(type_name, 16, 96)
        blocks = group_rows(type_name, raw) if grouped else raw
        for rows in (x[:1], x):
            got = block_op.linear(type_name, blocks, rows, grouped=grouped)
            assert got.dtype == torch.float32 and got.shape == (len(rows), 16)
            assert torch.equal(got, ggml_kernel.matmul(type_name, blocks, rows, grouped=grouped)), type_name


def _tiny(tmp_path, qtype, tied):
    f = tmp_path / f"{qtype}{'-tied' if tied else ''}.gguf"
    hf = tiny_hf_model("llama", n_heads=4, n_kv=2, hidden_size=64, intermediate_size=128, head_dim=16, tied=tied)
    write_tiny_gguf(f, hf, qtype=qtype)
    return f


@pytest.mark.parametrize("tied", [False, True])
@pytest.mark.parametrize("qtype", TYPES)
def test_a_file_loads_into_its_own_blocks_bit_for_bit(tmp_path, qtype, tied):
    """Every layer matrix (q and k rows permuted from llama.cpp's order included) and the embedding
    (the tied head's blocks, or its own) are the file's exact weights, and the logits lie close to
    the float32 loader's."""
    f = _tiny(tmp_path, qtype, tied)
    native, used = load_gguf_native(f)
    exact = llamablock.load_pretrained(f, torch.float32)
    linears = {n: m for n, m in exact.named_modules() if isinstance(m, nn.Linear)}
    # the head's blocks are the embedding's when tied; an untied embedding is one more tensor of blocks
    assert used[f"{qtype} blocks"] == len(linears) + (not tied)
    for name, linear in linears.items():
        layer = native.get_submodule(name)
        assert isinstance(layer, BlockLinear) and layer.type_name == qtype, name
        assert torch.equal(layer.dequantized(), linear.weight), name
    # the embedding reads blocks, tied or not: the head's rows, or its own (never a float table)
    assert isinstance(native.embed, BlockEmbedding) and hasattr(native.embed, "rows") != tied
    vocab = exact.embed.weight.shape[0]
    assert torch.equal(native.embed(torch.arange(vocab)), exact.embed.weight)
    ids = torch.randint(0, vocab, (1, 72), generator=torch.Generator().manual_seed(0))  # more than a tile of 64
    with torch.no_grad():
        got, want = native(ids), exact(ids)
    # 16-bit activations put a relative error of about 2^-16 on each product; 1e-3 of the largest
    # logit leaves room for its growth through the layers and catches 8 bits (about 2^-8)
    assert (got - want).abs().max() <= 1e-3 * want.abs().max()


def test_a_16_bit_embedding_beside_blocks_keeps_float32_activations(tmp_path):
    """A common conversion: layers Q4_0, the (untied) embedding F16. Only packed layers need bfloat16."""
    hf = tiny_hf_model("llama", n_heads=4, n_kv=2, hidden_size=64, intermediate_size=128, head_dim=16)
    table = hf.state_dict()["model.embed_tokens.weight"].float().numpy().astype(np.float16)
    f = tmp_path / "f16-embedding.gguf"
    write_tiny_gguf(f, hf, qtype="Q4_0", raw_blocks={"token_embd.weight": (table, "F16")})
    native, _ = load_gguf_native(f)
    assert native.embed.weight.dtype == torch.float32 and isinstance(native.layers[0].attn.wq, BlockLinear)
    assert torch.equal(native.embed.weight, torch.from_numpy(table).float())


def test_without_the_kernel_the_blocks_are_re_quantized(tmp_path, monkeypatch):
    """No compiler (or LLAMABLOCK_NO_KERNEL=1): PyTorch's packed layers, and the summary says why."""
    from llamablock.fast import machine
    from llamablock.fast.kernels.quant import Int4Linear
    from llamablock.fast.plan import load_in_format
    from llamablock.io.source import open_source

    no_kernel = machine.this_machine().without_kernel("no C compiler (cc) on the PATH")
    monkeypatch.setattr(machine, "this_machine", lambda: no_kernel)
    model, what = load_in_format(open_source(_tiny(tmp_path, "Q4_1", False)), "auto")
    assert isinstance(model.layers[0].attn.wq, Int4Linear)
    assert what.endswith("(Q4_1 re-quantized: no C compiler (cc) on the PATH)"), what


@pytest.mark.slow
def test_smollm2_runs_its_own_q4_1_blocks():
    """The embedded model: 210 Q4_1 matrices and the Q8_0 tied embedding kept; its logits follow the
    float32 model's, which puts the same token first at every position of a real text."""
    from llamablock.fast.plan import load_in_format
    from llamablock.io.source import open_source

    source = open_source(None)
    (model, what), tok = load_in_format(source, "auto"), source.tokenizer
    assert what == "the file's own precision: 210 tensors Q4_1 blocks, 1 tensors Q8_0 blocks, 61 tensors float32"
    exact = llamablock.load_pretrained(None, torch.float32)
    ids = torch.tensor([tok.encode(" ".join(["The capital of France is Paris."] * 6))])
    with torch.no_grad():
        got, want = model(ids), exact(ids)
    assert torch.equal(got.argmax(-1), want.argmax(-1))
    assert (got - want).abs().max() <= 1e-3 * want.abs().max()


def test_activations_take_8_or_16_bits_only():
    raw = torch.from_numpy(_random_blocks("Q4_0", 8, 64, seed=1))
    with pytest.raises(ValueError, match="8 or 16 bits, not 12"):
        ggml_kernel.matmul("Q4_0", raw, torch.randn(1, 64), bits=12)

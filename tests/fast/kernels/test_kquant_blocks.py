"""Q5_0 and the K types (Q4_K, Q5_K, Q6_K) kept as the file's own blocks (fast/kernels/c/, file_blocks.py),
in the file's order of rows and, for the K types, in groups of 8 rows (c/x86_super.h).

References, independent of the code under test:
  * the `gguf` package's numpy dequantization (gguf.quants.dequantize): the blocks' exact weights,
    which `dequantize_blocks` must reproduce bit for bit;
  * float64 products with those weights, against which the kernel must stay within the bound its
    16-bit activations imply (derived at `_bound`, as test_file_blocks.py derives its own).
gguf cannot quantize the K types, so the blocks are random bytes with finite float16 scales, and
blocks built at the extremes of their ids and scales.
"""

from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch
from kernel_builds import RUNS  # the builds this CPU runs; conftest.py's `libs` builds each once
from random_blocks import HALVES, random_blocks

from llamablock.fast.kernels import block_op, ggml_kernel
from llamablock.fast.kernels.file_blocks import BlockEmbedding, BlockLinear, dequantize_blocks, group_rows, ungroup_rows

TYPES = ("Q5_0", "Q4_K", "Q5_K", "Q6_K")
K = 512  # two super-blocks of 256 per row, 16 blocks of 32
LAYOUTS = [pytest.param(False, id="file's rows"), pytest.param(True, id="groups of 8")]


def _laid_out(type_name: str, raw, grouped: bool) -> torch.Tensor:
    """raw (rows, bytes) as a tensor in the layout asked for; skips a type without groups."""
    raw = torch.as_tensor(raw)
    if not grouped:
        return raw
    if type_name not in ggml_kernel.GROUPABLE:
        pytest.skip(f"{type_name} has no grouped layout")
    return group_rows(type_name, raw)


def _random_blocks(type_name: str, n: int, k: int = K, seed: int = 0) -> np.ndarray:
    return random_blocks(type_name, n, k, seed)


def _extremes(type_name: str, k: int = K) -> np.ndarray:
    """Rows of every id at its largest, then every id at its smallest, each with d (and dmin) at
    +-65504, 2^-24 (float16's smallest subnormal) and 0; the K types' scales at their largest
    magnitude (6-bit 63; Q6_K's int8 -128, whose product with id 0 - 32 is the largest)."""
    rows = []
    for ids in (0xFF, 0x00):
        for half in (0x7BFF, 0xFBFF, 0x0001, 0x0000):
            b = _random_blocks(type_name, 1, k).reshape(k // ggml_kernel.SIZES[type_name][0], -1)
            b[:] = ids
            if type_name in ("Q4_K", "Q5_K"):
                b[:, 4:16] = 0xFF
            if type_name == "Q6_K":
                b[:, 192:208] = 0x80
            for at in HALVES[type_name]:
                b[:, at:at + 2] = np.array([half], dtype=np.uint16).view(np.uint8)
            rows.append(b.reshape(-1))
    return np.stack(rows)


def _exact(type_name: str, raw: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(gguf.quants.dequantize(raw, gguf.GGMLQuantizationType[type_name]).reshape(len(raw), -1))


def _magnitude(type_name: str, raw: np.ndarray) -> torch.Tensor:
    """Per weight, the size of the float terms the kernel adds for it: |d sc q| + |dmin m| for Q4_K
    and Q5_K (each term dequantized alone, the other's float16 zeroed), |w| for the one-term types."""
    if type_name not in ("Q4_K", "Q5_K"):
        return _exact(type_name, raw).abs()
    blocks = raw.reshape(len(raw), -1, ggml_kernel.BLOCK_BYTES[type_name])
    d_only, dmin_only = blocks.copy(), blocks.copy()
    d_only[..., 2:4], dmin_only[..., 0:2] = 0, 0
    return _exact(type_name, d_only.reshape(len(raw), -1)).abs() + _exact(type_name, dmin_only.reshape(len(raw), -1)).abs()


def _bound(w: torch.Tensor, mag: torch.Tensor, x: torch.Tensor, bits: int = 16) -> torch.Tensor:
    """|kernel - x W^T| per output, for W (n, k) exact, `mag` its terms' sizes (_magnitude), x (m, k).
    Quantization, as test_file_blocks._bound: x is rounded to e p, p an integer of 16 bits and
    e = (block max |x|) / 32767 per block of 32 (8 bits: / 127), which moves each product by at most e / 2 |w| (1.01:
    e and 1/e are rounded themselves). The kernel's value is exactly sum_i w_i e p_i before its
    float32 arithmetic: a block's integer sum of (sc q) p is exact in int32 lanes, whose conversion
    to float rounds past 2^24; then d e, the product by the sums, -dmin m e P (two roundings), and
    two terms per block of x (the K types' d and dmin terms, or Q5_0's one) summed in float32:
    at most (2 blocks + 16) units of 2^-24 of sum mag |x| (where d sc q and dmin m cancel, their
    roundings count at their own sizes: hence mag, not |w|). The reference rounds d sc q - dmin m
    once to float32, one more unit of that sum, inside the 16."""
    m, k = x.shape
    e = x.abs().reshape(m, k // 32, 32).amax(-1).double() / (32767 if bits == 16 else 127)  # (m, blocks)
    w_blocks = w.abs().double().reshape(w.shape[0], k // 32, 32).sum(-1)  # (n, blocks)
    quantization = 1.01 * (e / 2) @ w_blocks.T  # (m, n)
    arithmetic = (2 * (k // 32) + 16) * 2.0**-24 * (x.abs().double() @ mag.double().T)
    return quantization + arithmetic


def _activations(k: int = K, rows: int = 9) -> torch.Tensor:
    """Blocks of very different sizes; a block of zeros; an outlier; a tiny block (1e-30: a finite
    1/e still); every integer at +-32767 (the largest integer sums); a row of 1e-40 (subnormal: no
    finite 1/e, counted as zeros)."""
    x = torch.randn(rows, k, generator=torch.Generator().manual_seed(3)) * torch.logspace(-3, 2, k)
    x[1, 32:64] = 0
    x[2, 70] = 1e4
    x[3, 96:128] *= 1e-30
    x[4], x[5], x[6] = 1.0, -1.0, torch.tensor([1.0, -1.0]).repeat(k // 2)
    x[8] = torch.randn(k) * 1e-40
    return x


@pytest.mark.parametrize("type_name", TYPES)
@pytest.mark.parametrize("source", ["random bytes", "extremes"])
def test_dequantize_equals_the_gguf_package_bit_for_bit(type_name, source):
    raw = _random_blocks(type_name, 12, seed=1) if source == "random bytes" else _extremes(type_name)
    got = dequantize_blocks(type_name, torch.from_numpy(raw.copy()))
    want = _exact(type_name, raw)
    assert got.dtype == torch.float32 and torch.isfinite(want).all() and torch.equal(got, want)


@pytest.mark.parametrize("type_name", TYPES)
@pytest.mark.parametrize("isa", list(ggml_kernel.ISAS))
@pytest.mark.parametrize("grouped", LAYOUTS)
@pytest.mark.parametrize("bits", [16, 8])
def test_the_kernel_is_within_its_activation_bound(type_name, isa, grouped, bits, libs):
    """Random blocks and blocks at their extremes, decode (one row) and prefill, in every build and
    layout, activations in 16 bits and in 8 (a misplaced byte of the grouped layout moves a product
    far past the bound; so does a half of x's bytes skipped in 16 bits)."""
    if isa not in RUNS:
        pytest.skip(f"this CPU does not run the {isa} build")
    raw = np.concatenate([_random_blocks(type_name, 24, seed=2), _extremes(type_name)])
    w, mag, x, blocks = _exact(type_name, raw), _magnitude(type_name, raw), _activations(), _laid_out(type_name, raw,
                                                                                                     grouped)
    for rows in (x[:1], x[:8]):
        got = ggml_kernel.matmul(type_name, blocks, rows, lib=libs[isa], grouped=grouped, bits=bits).double()
        err, bound = (got - rows.double() @ w.double().T).abs(), _bound(w, mag, rows, bits)
        assert (err <= bound).all(), (err / bound.clamp(min=1e-300)).max()
    got = ggml_kernel.matmul(type_name, blocks, x, lib=libs[isa], grouped=grouped, bits=bits)
    assert torch.equal(got[8], torch.zeros(len(raw))), "a row of subnormals counts as zeros"


@pytest.mark.parametrize("isa", list(ggml_kernel.ISAS))
@pytest.mark.parametrize("grouped", LAYOUTS)
def test_a_row_is_the_same_alone_and_among_others(isa, grouped, libs):
    """Prefill takes rows four at a time and decode one: bit for bit the same result either way."""
    if isa not in RUNS:
        pytest.skip(f"this CPU does not run the {isa} build")
    x = _activations(rows=69)  # a tile of 64 (sixteen groups of four) and five more, four and one alone
    for type_name in [t for t in TYPES if not grouped or t in ggml_kernel.GROUPABLE]:
        raw = _laid_out(type_name, np.concatenate([_random_blocks(type_name, 8, seed=4), _extremes(type_name)]), grouped)
        for bits in (16, 8):
            together = ggml_kernel.matmul(type_name, raw, x, lib=libs[isa], grouped=grouped, bits=bits)
            alone = torch.cat([ggml_kernel.matmul(type_name, raw, x[i:i + 1], lib=libs[isa], grouped=grouped,
                                                  bits=bits) for i in range(len(x))])
            assert torch.equal(together, alone), (type_name, bits)


@pytest.mark.parametrize("grouped", LAYOUTS)
def test_the_vnni_build_is_the_avx512_build_bit_for_bit(grouped, libs):
    """The file's order of rows runs the same code in both; in groups, VNNI's dpbusd and the other
    builds' maddubs and madd reach the same exact integer sums, then the same float steps."""
    if "avx512vnni" not in RUNS:
        pytest.skip("this CPU does not run the avx512vnni build")
    x = _activations(rows=37)
    for type_name in [t for t in TYPES if not grouped or t in ggml_kernel.GROUPABLE]:
        raw = _laid_out(type_name, np.concatenate([_random_blocks(type_name, 8, seed=5), _extremes(type_name)]), grouped)
        want = ggml_kernel.matmul(type_name, raw, x, lib=libs["avx512"], grouped=grouped)
        assert torch.equal(ggml_kernel.matmul(type_name, raw, x, lib=libs["avx512vnni"], grouped=grouped), want)
        if grouped:  # the groups' code is the same 256-bit code in every x86 build
            assert torch.equal(ggml_kernel.matmul(type_name, raw, x, lib=libs["avx2"], grouped=grouped), want)


def test_two_threads_compute_what_one_does():
    raw = torch.from_numpy(_random_blocks("Q4_K", 40, seed=6))
    x = _activations()[:3]
    for threads in (2, 3, 16):
        assert torch.equal(ggml_kernel.matmul("Q4_K", raw, x, threads=threads),
                           ggml_kernel.matmul("Q4_K", raw, x, threads=1)), threads


@pytest.mark.parametrize("type_name", ["Q4_K", "Q6_K"])
def test_threads_split_a_prompt_as_one_thread_does(type_name):
    """A prompt's rows in groups (the AVX-512 VNNI build's panels, x's copy made by every thread):
    any thread count gives one thread's bits, in 5 groups, so some threads have a lone group, or none."""
    raw = group_rows(type_name, torch.from_numpy(_random_blocks(type_name, 40, seed=7)))
    x = _activations(rows=37)
    one = ggml_kernel.matmul(type_name, raw, x, threads=1, grouped=True)
    for threads in (2, 3, 16):
        assert torch.equal(ggml_kernel.matmul(type_name, raw, x, threads=threads, grouped=True), one), threads


@pytest.mark.parametrize("isa", RUNS)
def test_matrices_read_together_give_each_matrix_s_own_bits(isa, libs):
    """lb_linear_many (c/linear.c: a decode step's q, k, v, or gate and up, in one parallel region) gives
    each matrix what lb_linear gives it alone, bit for bit: mixed types and layouts, shares that end
    inside a matrix or leave a thread none, at 1, 4 and 37 rows and 1 to 3 threads."""
    import ctypes

    from llamablock.fast.decode_step import _Matrix

    lib = libs[isa]
    lib.lb_linear_many.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int64, ctypes.c_void_p, ctypes.c_int64,
                                   ctypes.c_void_p, ctypes.c_int, ctypes.c_int]
    mats = [("Q4_K", 40, True, 1), ("Q6_K", 8, True, 2), ("Q5_0", 24, False, 3), ("Q6_K", 16, False, 4)]
    raws = [_laid_out(t, _random_blocks(t, n, seed=s), grouped) for t, n, grouped, s in mats]
    structs = [_Matrix(ggml_kernel.TYPE_IDS[t], int(g), raw.data_ptr(), n, None)
               for (t, n, g, _), raw in zip(mats, raws, strict=True)]
    pointers = (ctypes.POINTER(_Matrix) * len(structs))(*(ctypes.pointer(m) for m in structs))
    x = _activations(rows=37)
    for rows in (x[:1], x[:4], x):
        for threads in (1, 2, 3):
            ys = [torch.full((len(rows), n), float("nan")) for _, n, _, _ in mats]
            outs = (ctypes.c_void_p * len(ys))(*(y.data_ptr() for y in ys))
            assert lib.lb_linear_many(pointers, len(mats), K, rows.data_ptr(), len(rows), outs, threads, 16) == 0
            for (t, _, grouped, _), raw, y in zip(mats, raws, ys, strict=True):
                want = ggml_kernel.matmul(t, raw, rows, threads=1, lib=lib, grouped=grouped)
                assert torch.equal(y, want), (t, len(rows), threads)


def test_the_operator_and_the_ctypes_call_give_the_same_bits():
    """A layer's binding is either ggml_kernel.matmul or block_op.linear: the same outputs."""
    assert block_op.load(), block_op.why_not()
    x = _activations(rows=37)
    for type_name, grouped in [(t, False) for t in TYPES] + [(t, True) for t in ggml_kernel.GROUPABLE if t in TYPES]:
        raw = _laid_out(type_name, np.concatenate([_random_blocks(type_name, 8, seed=7), _extremes(type_name)]), grouped)
        for rows in (x[:1], x):
            got = block_op.linear(type_name, raw, rows, grouped=grouped)
            assert got.dtype == torch.float32 and got.shape == (len(rows), len(raw))
            assert torch.equal(got, ggml_kernel.matmul(type_name, raw, rows, grouped=grouped)), type_name


@pytest.mark.parametrize("isa", list(ggml_kernel.ISAS))
def test_each_build_s_table_groups_exactly_the_groupable_types(isa, libs):
    """lb_block_groups (c/blocks.h `chunks`) agrees with ggml_kernel.GROUPABLE for every kept type,
    and a grouped call of another type is refused by the library, not computed from misread bytes."""
    if isa not in RUNS:
        pytest.skip(f"this CPU does not run the {isa} build")
    lib = libs[isa]
    assert {n for n in ggml_kernel.KEPT if lib.lb_block_groups(ggml_kernel.TYPE_IDS[n])} == set(ggml_kernel.GROUPABLE)
    for type_name in [t for t in TYPES if t not in ggml_kernel.GROUPABLE]:
        with pytest.raises(ValueError, match="does not compute .* in that layout"):
            ggml_kernel.matmul(type_name, torch.from_numpy(_random_blocks(type_name, 8)), torch.randn(1, K), lib=lib,
                               grouped=True)


def test_the_types_without_groups_are_refused_groups_in_python_and_by_the_operator():
    raw = torch.from_numpy(_random_blocks("Q5_0", 8))
    with pytest.raises(ValueError, match="Q5_0 blocks have no grouped layout"):
        group_rows("Q5_0", raw)
    with pytest.raises(ValueError, match="Q5_0 blocks have no grouped layout"):
        BlockLinear("Q5_0", raw, K, grouped=True)
    assert block_op.load(), block_op.why_not()
    with pytest.raises(RuntimeError, match="no layout 1 for GGML type 6"):
        block_op.linear("Q5_0", raw, torch.randn(1, K), grouped=True)


@pytest.mark.parametrize("type_name", ["Q4_K", "Q5_K", "Q6_K"])
def test_grouping_only_moves_bytes(type_name):
    """group_rows undone gives the file's rows; each group holds exactly its 8 rows' bytes."""
    raw = torch.from_numpy(_random_blocks(type_name, 16, seed=9))
    grouped = group_rows(type_name, raw)
    assert grouped.shape == raw.shape and not torch.equal(grouped, raw)
    assert torch.equal(ungroup_rows(type_name, grouped), raw)
    for g in range(2):
        assert torch.equal(grouped[8 * g:8 * g + 8].flatten().sort().values, raw[8 * g:8 * g + 8].flatten().sort().values)


@pytest.mark.parametrize("type_name", TYPES)
@pytest.mark.parametrize("grouped", LAYOUTS)
def test_a_layer_and_its_embedding_are_the_file_s_weights(type_name, grouped):
    """BlockLinear over super-blocks: rows of whole blocks only; its dequantization and the embedding
    rows read from it are gguf's bit for bit; its output is within the kernel's bound."""
    raw = _random_blocks(type_name, 16, seed=8)
    with pytest.raises(ValueError, match="blocks of"):
        BlockLinear(type_name, torch.from_numpy(raw), K + 32)
    layer = BlockLinear(type_name, _laid_out(type_name, raw, grouped), K, grouped=grouped)
    w = _exact(type_name, raw)
    assert torch.equal(layer.dequantized(), w)
    ids = torch.tensor([[0, 7, 8, 15], [15, 3, 3, 1]])
    assert torch.equal(BlockEmbedding(layer)(ids), w[ids])
    x = _activations()[:3]
    assert ((layer(x).double() - x.double() @ w.double().T).abs() <= _bound(w, _magnitude(type_name, raw), x)).all()

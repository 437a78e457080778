"""The C every build shares beside the entry point: the dequantizer (c/dequant.c), with the float GEMM
that prefill runs over its rows (ggml_kernel.matmul's gemm_from, block_op.cpp's float_gemm), and the
grouped layout made in place at load (c/layout.c).

References, independent of the code under test:
  * the `gguf` package's numpy dequantization (gguf.quants.dequantize), which every build's
    lb_dequantize must equal bit for bit, in both layouts;
  * file_blocks.group_rows' torch reordering, which the C grouping must equal byte for byte;
  * float64 products with those weights, which the float32 GEMM must meet within float32's bound
    for a sum of k products: (k + 1) 2^-24 sum |x| |w| (Higham, Accuracy and Stability of
    Numerical Algorithms, 3.1: gamma_n for a dot product of n terms; 1.01 for gamma's denominator).
The blocks are random bytes with finite float16 scales of every size (tests/random_blocks.py).
"""

from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch
from kernel_builds import RUNS  # the builds this CPU runs; conftest.py's `libs` builds each once
from random_blocks import random_blocks

from llamablock.fast.kernels import block_op, ggml_kernel
from llamablock.fast.kernels.file_blocks import group_rows

K = 512  # two super-blocks of 256 per row
LAYOUTS = [pytest.param(False, id="file's rows"), pytest.param(True, id="groups of 8")]


def _random_blocks(type_name: str, n: int, seed: int = 0) -> np.ndarray:
    return random_blocks(type_name, n, K, seed)


def _exact(type_name: str, raw: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(gguf.quants.dequantize(raw, gguf.GGMLQuantizationType[type_name]).reshape(len(raw), -1))


def _laid_out(type_name: str, raw: np.ndarray, grouped: bool) -> torch.Tensor:
    if grouped and type_name not in ggml_kernel.GROUPABLE:
        pytest.skip(f"{type_name} has no grouped layout")
    raw = torch.from_numpy(raw.copy())
    return group_rows(type_name, raw) if grouped else raw


@pytest.mark.parametrize("type_name", ggml_kernel.KEPT)
@pytest.mark.parametrize("isa", RUNS)
@pytest.mark.parametrize("grouped", LAYOUTS)
def test_every_build_dequantizes_as_the_gguf_package_bit_for_bit(type_name, isa, grouped, libs):
    raw = _random_blocks(type_name, 24, seed=1)
    blocks, want = _laid_out(type_name, raw, grouped), _exact(type_name, raw)
    for threads in (1, 2):
        got = ggml_kernel.dequantize(type_name, blocks, K, grouped=grouped, threads=threads, lib=libs[isa])
        assert got.dtype == torch.float32 and torch.isfinite(want).all() and torch.equal(got, want), threads
    part = ggml_kernel.dequantize(type_name, blocks, K, slice(8, 19), grouped=grouped, lib=libs[isa])
    assert torch.equal(part, want[8:19])  # rows of a group's middle, into a fresh tensor


def test_a_tile_is_written_into_the_buffer_given():
    raw = _random_blocks("Q4_0", 16)
    buffer = torch.full((12, K), float("nan"))
    got = ggml_kernel.dequantize("Q4_0", torch.from_numpy(raw), K, slice(4, 14), out=buffer)
    assert got.data_ptr() == buffer.data_ptr() and torch.equal(got, _exact("Q4_0", raw)[4:14])
    assert torch.isnan(buffer[10:]).all()  # rows past the slice untouched
    with pytest.raises(ValueError, match="at least 10 rows of 512"):  # too short: C would write past its end
        ggml_kernel.dequantize("Q4_0", torch.from_numpy(raw), K, slice(4, 14), out=buffer[:9])
    with pytest.raises(ValueError, match="not step 2"):  # rows apart: C reads a run of rows
        ggml_kernel.dequantize("Q4_0", torch.from_numpy(raw), K, slice(0, 8, 2))


@pytest.mark.parametrize("type_name", ggml_kernel.KEPT)
@pytest.mark.parametrize("grouped", LAYOUTS)
def test_the_float_gemm_is_within_float32_s_bound_of_the_exact_product(type_name, grouped):
    """264 rows: a whole tile of 256 and a part. Below gemm_from the kernel runs as before, from it
    the GEMM, whose x is never rounded to the kernel's integers: 8 bits give it the same bits."""
    raw = _random_blocks(type_name, 264, seed=2)
    blocks, w = _laid_out(type_name, raw, grouped), _exact(type_name, raw).double()
    x = torch.randn(6, K, generator=torch.Generator().manual_seed(4)) * torch.logspace(-2, 2, K)
    want = x.double() @ w.T
    bound = 1.01 * (K + 1) * 2.0**-24 * (x.abs().double() @ w.abs().T)
    gemm = ggml_kernel.matmul(type_name, blocks, x, grouped=grouped, gemm_from=6)
    kernel = ggml_kernel.matmul(type_name, blocks, x, grouped=grouped, gemm_from=7)
    assert torch.equal(kernel, ggml_kernel.matmul(type_name, blocks, x, grouped=grouped))
    assert ((gemm.double() - want).abs() <= bound).all()
    assert torch.equal(ggml_kernel.matmul(type_name, blocks, x, grouped=grouped, bits=8, gemm_from=6), gemm)
    assert not torch.equal(ggml_kernel.matmul(type_name, blocks, x, grouped=grouped, bits=8), kernel)


def test_the_operator_runs_the_gemm_as_the_ctypes_call_does():
    """Compiled programs call the operator, eager layers ctypes: the same tiles, the same bits."""
    assert block_op.load(), block_op.why_not()
    x = torch.randn(40, K, generator=torch.Generator().manual_seed(5))
    for type_name, grouped in [("Q4_0", True), ("Q6_K", True), ("Q5_0", False)]:
        blocks = _laid_out(type_name, _random_blocks(type_name, 264, seed=3), grouped)
        for gemm_from in (None, 16, 41):
            got = block_op.linear(type_name, blocks, x, grouped=grouped, gemm_from=gemm_from)
            assert torch.equal(got, ggml_kernel.matmul(type_name, blocks, x, grouped=grouped, gemm_from=gemm_from))


def test_what_it_cannot_dequantize_is_refused_by_name():
    raw = torch.from_numpy(_random_blocks("Q5_0", 8))
    with pytest.raises(ValueError, match="does not compute Q5_0 in that layout"):
        ggml_kernel.dequantize("Q5_0", raw, K, grouped=True)
    with pytest.raises(ValueError, match="Q4_0 rows of 500 weights are not whole blocks"):
        ggml_kernel.dequantize("Q4_0", torch.zeros(8, 500 // 32 * 18, dtype=torch.uint8), 500)


@pytest.mark.parametrize("type_name", ggml_kernel.GROUPABLE)
@pytest.mark.parametrize("isa", RUNS)
def test_grouping_in_place_in_c_is_the_torch_reference_byte_for_byte(type_name, isa, libs):
    """The loader groups in C (c/layout.c); file_blocks.group_rows' torch path (a copy) is the reference."""
    raw = torch.from_numpy(_random_blocks(type_name, 40, seed=6))
    want = group_rows(type_name, raw)  # not in place: the torch reordering
    for threads in (1, 2, 3):
        got = ggml_kernel.group_in_place(type_name, raw.clone(), threads=threads, lib=libs[isa])
        assert torch.equal(got, want), threads
    with pytest.raises(ValueError, match="not whole groups of 8"):
        ggml_kernel.group_in_place(type_name, raw[:12].clone(), lib=libs[isa])
    with pytest.raises(ValueError, match="contiguous rows of whole"):
        ggml_kernel.group_in_place(type_name, raw.view(torch.int8), lib=libs[isa])

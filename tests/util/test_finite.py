"""all_finite against torch.isfinite(t).all(), the exact definition, on the cases a sum could get wrong."""

import pytest
import torch

from llamablock.util.finite import all_finite


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64])
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf"), None])
def test_all_finite_equals_the_exact_check(dtype, bad):
    t = torch.randn(1000, dtype=torch.float32).to(dtype)
    if bad is not None:
        t[123] = bad
    assert all_finite(t) == bool(torch.isfinite(t).all()) == (bad is None)


def test_opposite_infinities_and_an_overflowing_sum():
    assert not all_finite(torch.tensor([float("inf"), -float("inf"), 1.0]))  # the sum is NaN
    big = torch.full((4,), torch.finfo(torch.bfloat16).max, dtype=torch.bfloat16)  # finite; its sum overflows
    assert torch.isinf(big.sum(dtype=torch.float32)) and all_finite(big)

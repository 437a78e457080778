"""The compiled RMSNorm and RoPE (llamablock.fast.compiled.fused) equal the eager reference to 1e-6.

The reference is llamablock's own RMSNorm and apply_rope, themselves checked against
transformers in test_components.py / test_rope.py; compiled kernels may only reorder float32
additions, so they agree to a few float32 ulps (1e-6 absolute and relative on unit-scale inputs).
"""

from __future__ import annotations

import pytest
import torch

from llamablock.config import ModelConfig
from llamablock.fast.compiled.fused import fused_apply_rope, fused_rms_norm
from llamablock.norm import RMSNorm
from llamablock.rope import apply_rope, rope_cos_sin


@pytest.mark.slow
def test_fused_rms_norm_equals_rmsnorm():
    norm = RMSNorm(576, eps=1e-5)
    norm.weight.data = torch.randn(576)
    x = torch.randn(2, 7, 576)
    with torch.no_grad():
        torch.testing.assert_close(fused_rms_norm(x, norm.weight, norm.eps), norm(x), atol=1e-6, rtol=1e-6)


@pytest.mark.slow
@pytest.mark.parametrize("layout", ["half", "interleaved"])
def test_fused_rope_equals_apply_rope(layout):
    cfg = ModelConfig(vocab_size=8, d_model=128, n_layers=1, n_heads=2, n_kv_heads=2, head_dim=64, d_ff=8,
                      max_seq_len=1 << 15)
    pos = torch.arange(8000, 8005)[None]  # far positions: the angles are large there
    cos, sin = rope_cos_sin(cfg, pos, torch.float32)
    x = torch.randn(1, 2, 5, 64)
    torch.testing.assert_close(fused_apply_rope(x, cos, sin, layout), apply_rope(x, cos, sin, layout),
                               atol=1e-6, rtol=1e-6)

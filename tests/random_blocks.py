"""Random GGUF weight blocks for the kernel tests: random bytes in every field (ids, high bits,
packed scales), with each block's float16 fields (d, and m or dmin) finite and of every size:
zeros, subnormals, and up to float16's largest. gguf cannot quantize the K types, so tests build
their blocks this way (tests/fast/kernels/test_kquant_blocks.py, test_dequant_and_layout.py)."""

import numpy as np

from llamablock.fast.kernels import ggml_kernel

# byte offsets of each block's float16 fields (c/blocks.h): d, then m (Q4_1) or dmin (Q4_K, Q5_K); Q6_K's d is last
HALVES = {"Q4_0": (0,), "Q4_1": (0, 2), "Q5_0": (0,), "Q8_0": (0,), "Q4_K": (0, 2), "Q5_K": (0, 2), "Q6_K": (208,)}


def random_blocks(type_name: str, n: int, k: int, seed: int = 0) -> np.ndarray:
    """(n, k / block weights * block bytes) uint8: n rows of k weights in `type_name` blocks."""
    rng = np.random.default_rng(seed)
    weights, size = ggml_kernel.SIZES[type_name]
    b = rng.integers(0, 256, size=(n, k // weights, size), dtype=np.uint8)
    for at in HALVES[type_name]:
        h = rng.normal(size=b.shape[:2]) * 10.0 ** rng.integers(-8, 5, size=b.shape[:2])
        h[rng.random(b.shape[:2]) < 0.1] = 0
        b[..., at:at + 2] = np.clip(h, -65504, 65504).astype(np.float16).view(np.uint8).reshape(*b.shape[:2], 2)
    return b.reshape(n, -1)

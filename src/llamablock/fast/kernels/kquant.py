"""A Q4_K tensor into the packed int4 layer with the file's own 4-bit ids, not re-quantized.

Q4_K (llama.cpp's k-quants, ggml-common.h block_q4_K) stores 256 weights per super-block: float16
d and dmin, eight 6-bit scales sc and mins m (12 bytes), and 4-bit ids q. Each group of 32 is
    w = (d sc) q - (dmin m),   q in 0..15,
which is the affine form of PyTorch's int4 kernel, (q - 8) s + z, with s = d sc and
z = 8 s - dmin m. So the ids can be kept as they are, and only s and z round to bfloat16 (the
kernel's precision: a relative 2^-8 each). Re-deriving a group's scale from its min and max
(Int4Linear's own quantizer) instead moves every weight whose group does not span all 16 ids
by up to half a step: tests/fast/kernels/test_kquant.py compares the two layers' errors, and `llamablock
bench kquants` measures the model's error in each --dtype on Gemma 3 270M Q4_K_M.

The sub-scales are unpacked by the gguf package's own Q4_K.get_scale_min; the id order (each 32
bytes give 32 weights from their low nibbles, then the next 32 from their high ones) is its
dequantize_blocks', against which tests/fast/kernels/test_kquant.py checks every weight.
"""

from __future__ import annotations

import numpy as np
import torch

from llamablock.fast.kernels.quant import PREFILL_ROWS, Int4Linear

Q4_K_BYTES = 144  # per 256 weights: d, dmin (float16), 12 bytes of scales and mins, 128 bytes of ids


def q4k_groups(rows: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """rows (n, k / 256 * 144) uint8, a Q4_K tensor's bytes -> ids q (n, k) uint8, and per group of 32
    the scale d sc and the offset dmin m (n, k / 32) float32: the weight is scale q - offset."""
    import gguf

    n = rows.shape[0]
    b = rows.numpy().reshape(-1, Q4_K_BYTES)  # (super-blocks, 144)
    d = b[:, 0:2].copy().view(np.float16).astype(np.float32)  # (blocks, 1)
    dmin = b[:, 2:4].copy().view(np.float16).astype(np.float32)
    sc, m = gguf.quants.Q4_K.get_scale_min(b[:, 4:16])  # (blocks, 8) each, 0..63
    qs = b[:, 16:].reshape(-1, 4, 1, 32) >> np.array([0, 4], dtype=np.uint8).reshape(1, 1, 2, 1)
    q = (qs & 15).reshape(n, k)
    scale = (d * sc.astype(np.float32)).reshape(n, k // 32)
    offset = (dmin * m.astype(np.float32)).reshape(n, k // 32)
    return torch.from_numpy(q), torch.from_numpy(scale), torch.from_numpy(offset)


def q4k_linear(rows: torch.Tensor, k: int, crossover: int | None = PREFILL_ROWS) -> Int4Linear:
    """The int4 layer of a Q4_K tensor's rows, its ids kept (module docstring); `crossover` as
    Int4Linear's."""
    q, scale, offset = q4k_groups(rows, k)
    s = scale.to(torch.bfloat16).float()  # z from the rounded s: (q - 8) s + z then errs only by z's rounding
    return Int4Linear.from_ids(q, s, 8 * s - offset, crossover=crossover)

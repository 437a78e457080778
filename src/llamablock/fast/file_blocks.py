"""Linear layers and an embedding that keep a GGUF's own Q4_0 / Q4_1 / Q8_0 blocks, byte for byte.

The file's quantized weights are the model its author shipped and llama.cpp runs; quantizing
them again into PyTorch's packed formats (fast/quant.py) moves every weight, and its bfloat16
scales drop bits of the file's float16 ones. These layers hold the file's bytes as read, in
(out, in / 32 * block bytes) rows, and compute with them directly through ggml_dot.c
(fast/ggml_kernel.py), x quantized to 16 bits per block of 32: `llamablock perplexity --compare
float32` measures what that costs against the exact weights in float32.
Prefill runs the same kernel as decode, and a row's products are the same bits whichever rows
are computed beside it, so a layer's output for a token does not depend on how the prompt was split
into steps (attention around it, as in any model, may round differently). Dequantizing a layer and calling the float32 GEMM would be faster for long prompts
only if the dequantization were cheap, and it costs more than the kernel's whole prefill at these
sizes in torch (`llamablock bench file_blocks` times both).
`dequantized()` is the file's exact dequantization, equal bit for bit to the gguf package's
(tests/fast/test_file_blocks.py): d * q + m, in float32, rounded once as gguf's numpy code does.
Block layouts are ggml_dot.c's comment.
"""

from __future__ import annotations

import torch
from torch import nn

from llamablock.fast import block_op, ggml_kernel
from llamablock.fast.ggml_kernel import BLOCK_BYTES, TYPE_IDS


def dequantize_blocks(type_name: str, blocks: torch.Tensor) -> torch.Tensor:
    """(n, k) float32 from (n, k / 32 * block bytes) uint8 rows of `type_name` blocks."""
    n = blocks.shape[0]
    b = blocks.reshape(n, -1, BLOCK_BYTES[type_name])  # (n, k/32, bytes)
    d = b[..., 0:2].contiguous().view(torch.float16).float()  # (n, k/32, 1)
    if type_name == "Q8_0":
        q = b[..., 2:].contiguous().view(torch.int8).float()  # (n, k/32, 32)
        return (d * q).reshape(n, -1)
    qs = b[..., -16:]
    q = torch.cat((qs & 15, qs >> 4), dim=-1).float()  # (n, k/32, 32): low nibbles are weights 0..15
    if type_name == "Q4_0":
        return (d * (q - 8)).reshape(n, -1)
    m = b[..., 2:4].contiguous().view(torch.float16).float()
    return (d * q + m).reshape(n, -1)


class BlockLinear(nn.Module):
    """y = x W^T (+ b) with W the file's blocks of `type_name` (Q4_0, Q4_1 or Q8_0), never re-quantized."""

    def __init__(self, type_name: str, blocks: torch.Tensor, in_features: int, bias: torch.Tensor | None = None):
        super().__init__()
        if type_name not in BLOCK_BYTES:
            raise ValueError(f"block type must be one of {', '.join(BLOCK_BYTES)}, got {type_name!r}")
        if in_features % 32 or blocks.shape[-1] != in_features // 32 * BLOCK_BYTES[type_name]:
            raise ValueError(f"{type_name} rows of {in_features} weights are {in_features // 32} blocks of "
                             f"{BLOCK_BYTES[type_name]} bytes; got rows of {blocks.shape[-1]} bytes")
        self.register_buffer("blocks", blocks.contiguous())  # (n, k/32 * bytes) uint8
        self.register_buffer("bias", None if bias is None else bias.detach().float())
        self.type_name, self.in_features, self.out_features = type_name, in_features, blocks.shape[0]

    def dequantized(self) -> torch.Tensor:
        return dequantize_blocks(self.type_name, self.blocks)  # (n, k)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        if block_op.LOADED:  # the operator a compiled program can trace; the same C function
            y = torch.ops.llamablock.block_linear(x.reshape(-1, shape[-1]), self.blocks, TYPE_IDS[self.type_name])
        else:
            y = ggml_kernel.matmul(self.type_name, self.blocks, x.reshape(-1, shape[-1]))  # (m, n) float32
        if self.bias is not None:
            y = y + self.bias
        return y.reshape(*shape[:-1], self.out_features).to(x.dtype)

    def extra_repr(self) -> str:
        return f"in={self.in_features}, out={self.out_features}, the file's {self.type_name} blocks"


class BlockEmbedding(nn.Module):
    """An embedding table read from a tied head's BlockLinear rows (one copy for both): row i is
    that row's exact dequantization. `weight` is an empty tensor of the activation dtype, as in
    fast/quant.py's Int8Embedding: callers read it for the dtype and device."""

    def __init__(self, head: BlockLinear, dtype: torch.dtype = torch.float32):
        super().__init__()
        self.head, self.dtype = [head], dtype  # a list: not a submodule, so its blocks are counted once
        self.num_embeddings, self.embedding_dim = head.out_features, head.in_features

    @property
    def weight(self) -> torch.Tensor:
        return torch.empty(0, dtype=self.dtype, device=self.head[0].blocks.device)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        head = self.head[0]
        rows = dequantize_blocks(head.type_name, head.blocks[ids.reshape(-1)])  # (tokens, d)
        return rows.reshape(*ids.shape, self.embedding_dim).to(self.dtype)

    def extra_repr(self) -> str:
        return f"{self.num_embeddings}, {self.embedding_dim}, {self.head[0].type_name} rows shared with the head"

"""Linear layers and an embedding that keep a GGUF's own Q4_0 / Q4_1 / Q8_0 blocks, byte for byte.

The file's quantized weights are the model its author shipped and llama.cpp runs; quantizing
them again into PyTorch's packed formats (fast/kernels/quant.py) moves every weight, and its bfloat16
scales drop bits of the file's float16 ones. These layers hold the file's bytes as read, in
(out, in / 32 * block bytes) rows, and compute with them directly through the block kernel (c/)
(fast/kernels/ggml_kernel.py), x quantized to 16 bits per block of 32: `llamablock perplexity --compare
float32` measures what that costs against the exact weights in float32.
Prefill runs the same kernel as decode, and a row's products are the same bits whichever rows
are computed beside it, so a layer's output for a token does not depend on how the prompt was split
into steps (attention around it, as in any model, may round differently). Dequantizing a layer and calling the float32 GEMM would be faster for long prompts
only if the dequantization were cheap, and it costs more than the kernel's whole prefill at these
sizes in torch (`llamablock bench file_blocks` times both).
`dequantized()` is the file's exact dequantization, equal bit for bit to the gguf package's
(tests/fast/kernels/test_file_blocks.py): d * q + m, in float32, rounded once as gguf's numpy code does.
Block layouts are c/blocks.h's comment.

Where the plan says so (fast/plan.py: the kernel's build for this CPU is faster on them), a layer
holds its bytes in groups of 8 rows (`group_rows`, the kernel's grouped layout): the same bytes
reordered once at load, so nothing is rounded and `file_rows()` gives the file's order back. A
layer calls the kernel through the binding it is given (ggml_kernel.matmul by ctypes, or
block_op.linear, the torch operator that compiled programs can trace): the same C function, so
the same numbers, and the layer never looks at what else the process has loaded.
"""

from __future__ import annotations

import torch
from torch import nn

from llamablock.fast.kernels import ggml_kernel
from llamablock.fast.kernels.ggml_kernel import BLOCK_BYTES, GROUP


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


def _head_bytes(type_name: str) -> int:
    return 4 if type_name == "Q4_1" else 2  # d, and m for Q4_1 (float16 each)


def group_rows(type_name: str, blocks: torch.Tensor) -> torch.Tensor:
    """The (n, k / 32 * bytes) file rows reordered into the kernel's groups of 8 rows (c/blocks.h) (n a multiple
    of 8), the same shape: per group and block, the 8 rows' d (and m), then chunks of 4 quant bytes
    of each row in turn. The scales move as int16 and the quants as int32 (4 bytes a chunk): a
    quarter of the elements a byte-wise transpose moves, which is most of a load's reordering time."""
    n, row = blocks.shape
    size, h = BLOCK_BYTES[type_name], _head_bytes(type_name)
    nb, groups, quants = row // size, n // GROUP, size - h
    out = torch.empty(groups, nb, GROUP * size, dtype=torch.uint8)
    step = max(1, (4 << 20) // (GROUP * row))  # groups at a time: a few MiB of temporaries, whatever the tensor
    for g in range(0, groups, step):
        b = blocks[g * GROUP:(g + step) * GROUP].reshape(-1, GROUP, nb, size)
        part = out[g:g + step]
        for i in range(0, h, 2):  # 8 d, then 8 m: (groups, 8, nb) -> (groups, nb, 8)
            scales = b[..., i:i + 2].contiguous().view(torch.int16).squeeze(-1)
            part[..., GROUP * i:GROUP * (i + 2)] = scales.transpose(1, 2).contiguous().view(torch.uint8).reshape(
                len(part), nb, 2 * GROUP)
        qs = b[..., h:].contiguous().view(torch.int32)  # (groups, 8, nb, chunks): a chunk of 4 bytes an element
        part[..., GROUP * h:] = qs.permute(0, 2, 3, 1).contiguous().view(torch.uint8).reshape(len(part), nb,
                                                                                            GROUP * quants)
    return out.reshape(n, row)


def ungroup_rows(type_name: str, grouped: torch.Tensor) -> torch.Tensor:
    """group_rows undone: the file's rows, byte for byte."""
    n, row = grouped.shape
    size, h = BLOCK_BYTES[type_name], _head_bytes(type_name)
    nb, groups, quants = row // size, n // GROUP, size - h
    g = grouped.reshape(groups, nb, GROUP * size)
    heads = [g[..., GROUP * i:GROUP * (i + 2)].reshape(groups, nb, GROUP, 2) for i in range(0, h, 2)]
    qs = g[..., GROUP * h:].reshape(groups, nb, quants // 4, GROUP, 4).transpose(2, 3)  # (groups, nb, row, chunk, 4)
    b = torch.cat([*heads, qs.reshape(groups, nb, GROUP, quants)], dim=-1)  # (groups, nb, 8, bytes)
    return b.transpose(1, 2).reshape(n, row)


class BlockLinear(nn.Module):
    """y = x W^T (+ b) with W the file's blocks of `type_name` (Q4_0, Q4_1 or Q8_0), never re-quantized.

    `blocks` are the file's rows in the file's order, or with `grouped` in group_rows' groups of 8
    rows (the loader groups them where the plan says so). `binding` is
    the function that multiplies, called as binding(type_name, blocks, x (m, k), grouped=...) ->
    (m, n) float32 (default: the ctypes kernel)."""

    def __init__(self, type_name: str, blocks: torch.Tensor, in_features: int, bias: torch.Tensor | None = None,
                 grouped: bool = False, binding=None):
        super().__init__()
        if type_name not in BLOCK_BYTES:
            raise ValueError(f"block type must be one of {', '.join(BLOCK_BYTES)}, got {type_name!r}")
        if in_features % 32 or blocks.shape[-1] != in_features // 32 * BLOCK_BYTES[type_name]:
            raise ValueError(f"{type_name} rows of {in_features} weights are {in_features // 32} blocks of "
                             f"{BLOCK_BYTES[type_name]} bytes; got rows of {blocks.shape[-1]} bytes")
        if grouped and blocks.shape[0] % GROUP:
            raise ValueError(f"grouped rows come in groups of {GROUP}; got {blocks.shape[0]} rows")
        self.register_buffer("blocks", blocks.contiguous())  # (n, k/32 * bytes) uint8, grouped or the file's
        self.register_buffer("bias", None if bias is None else bias.detach().float())
        self.type_name, self.in_features, self.out_features = type_name, in_features, blocks.shape[0]
        self.grouped, self.binding = grouped, binding or ggml_kernel.matmul

    def file_rows(self) -> torch.Tensor:
        """The file's bytes in the file's order: (n, k / 32 * bytes) uint8."""
        return ungroup_rows(self.type_name, self.blocks) if self.grouped else self.blocks

    def dequantized(self) -> torch.Tensor:
        return dequantize_blocks(self.type_name, self.file_rows())  # (n, k)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        y = self.binding(self.type_name, self.blocks, x.reshape(-1, shape[-1]), grouped=self.grouped)  # (m, n) float32
        if self.bias is not None:
            y = y + self.bias
        return y.reshape(*shape[:-1], self.out_features).to(x.dtype)

    def extra_repr(self) -> str:
        order = ", in groups of 8 rows" if self.grouped else ""
        return f"in={self.in_features}, out={self.out_features}, the file's {self.type_name} blocks{order}"


class BlockEmbedding(nn.Module):
    """An embedding table read from a tied head's BlockLinear rows (one copy for both): row i is
    that row's exact dequantization. `weight` is an empty tensor of the activation dtype, as in
    fast/kernels/quant.py's Int8Embedding: callers read it for the dtype and device."""

    def __init__(self, head: BlockLinear, dtype: torch.dtype = torch.float32):
        super().__init__()
        self.head, self.dtype = [head], dtype  # a list: not a submodule, so its blocks are counted once
        self.num_embeddings, self.embedding_dim = head.out_features, head.in_features

    @property
    def weight(self) -> torch.Tensor:
        return torch.empty(0, dtype=self.dtype, device=self.head[0].blocks.device)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        head, flat = self.head[0], ids.reshape(-1)
        if head.grouped:  # each id's group of 8 rows, back in the file's order, then its own row
            groups = head.blocks.reshape(head.out_features // GROUP, -1)[flat // GROUP]  # (tokens, 8 * row)
            rows = ungroup_rows(head.type_name, groups.reshape(-1, head.blocks.shape[1]))
            rows = rows.reshape(-1, GROUP, rows.shape[-1])  # (tokens, 8, row); a gather, not arange(tokens),
            pick = (flat % GROUP).reshape(-1, 1, 1).expand(-1, 1, rows.shape[-1])  # so that export keeps tokens dynamic
            file_rows = rows.gather(1, pick).squeeze(1)
        else:
            file_rows = head.blocks[flat]
        rows = dequantize_blocks(head.type_name, file_rows)  # (tokens, d)
        return rows.reshape(*ids.shape, self.embedding_dim).to(self.dtype)

    def extra_repr(self) -> str:
        return f"{self.num_embeddings}, {self.embedding_dim}, {self.head[0].type_name} rows shared with the head"

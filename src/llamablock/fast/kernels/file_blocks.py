"""Linear layers and an embedding that keep a GGUF's own quantized blocks, byte for byte.

The types are ggml_kernel.KEPT: Q4_0, Q4_1, Q5_0 and Q8_0 (blocks of 32 weights), and the K types
Q4_K, Q5_K and Q6_K (super-blocks of 256 weights, what Q4_K_M files hold).

The file's quantized weights are the model its author shipped and llama.cpp runs; quantizing
them again into PyTorch's packed formats (fast/kernels/quant.py) moves every weight, and its bfloat16
scales drop bits of the file's float16 ones. These layers hold the file's bytes as read, in
(out, in / block weights * block bytes) rows, and compute with them directly through the block kernel (c/)
(fast/kernels/ggml_kernel.py), x quantized to 16 bits per block of 32: `llamablock perplexity --compare
float32` measures what that costs against the exact weights in float32.
Prefill runs the same kernel as decode up to the plan's crossover, and there a row's products are
the same bits whichever rows are computed beside it. From the crossover on (a CPU kind's row count,
ggml_kernel.GEMM_FROM_BY_CPU, handed over with the binding), the layer's rows are dequantized a
tile at a time in C (exactly: c/dequant.c) for one float32 GEMM each, x unrounded, where the CPU's
float GEMM outruns the integer products (`llamablock bench prefill_crossover`): a long prompt's
outputs are then nearer the exact model than the kernel's, and may differ from the same tokens fed
in short steps in the last bits.
`dequantized()` is the file's exact dequantization, equal bit for bit to the gguf package's
(tests/fast/kernels/test_file_blocks.py, test_kquant_blocks.py): d * q + m, or the K types'
d sc q - dmin m, in float32; every product of these scales and integers is exact in float32 (at
most 11 + 7 + 5 significant bits), so the one rounding is the sum's, as in gguf's numpy code.
Block layouts are c/blocks.h's comment.

Where the plan says so (fast/plan.py: the kernel's build for this CPU is faster on them), a layer
of a type in ggml_kernel.GROUPABLE (all KEPT but Q5_0) holds its bytes in groups of 8 rows (`group_rows`, the kernel's grouped layout): the same bytes
reordered once at load, so nothing is rounded and `file_rows()` gives the file's order back. A
layer calls the kernel through the binding it is given (ggml_kernel.matmul by ctypes, or
block_op.linear, the torch operator that compiled programs can trace): the same C function, so
the same numbers, and the layer never looks at what else the process has loaded.
"""

from __future__ import annotations

import torch
from torch import nn

from llamablock.fast.kernels import ggml_kernel
from llamablock.fast.kernels.ggml_kernel import BLOCK_BYTES, GROUP, GROUPABLE, SIZES


def _half(b: torch.Tensor, at: int) -> torch.Tensor:
    """The float16 at bytes at, at + 1 of each block of b (n, blocks, bytes), as (n, blocks, 1) float32."""
    return b[..., at:at + 2].contiguous().view(torch.float16).float()


def _bits(b: torch.Tensor, width: int) -> torch.Tensor:
    """b (..., bytes) uint8 as its `width`-bit fields, the lowest first: (..., 8 / width, bytes)."""
    shifts = torch.arange(0, 8, width, dtype=torch.uint8).reshape(-1, 1)
    return (b.unsqueeze(-2) >> shifts) & (2**width - 1)


def _k_scales(s: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The 6-bit scales and mins of Q4_K / Q5_K's 12 bytes (n, blocks, 12), (n, blocks, 8) float32 each:
    groups 0..3 in the low 6 bits of bytes 0..3 and 4..7, groups 4..7 in the nibbles of bytes 8..11
    with the top 2 bits of bytes 0..3 and 4..7 (ggml-quants.c get_scale_min_k4)."""
    lo, hi, mix = s[..., 0:4], s[..., 4:8], s[..., 8:12]
    sc = torch.cat((lo & 63, (mix & 15) | (lo >> 6 << 4)), dim=-1)
    m = torch.cat((hi & 63, (mix >> 4) | (hi >> 6 << 4)), dim=-1)
    return sc.float(), m.float()


def _k_weights(type_name: str, b: torch.Tensor) -> torch.Tensor:
    """(n, blocks, 256) float32 from (n, blocks, bytes) K-type super-blocks (c/blocks.h's layouts)."""
    n, nb = b.shape[:2]
    if type_name == "Q6_K":  # ql[128], qh[64], scales[16] int8, d: groups of 16
        low = _bits(b[..., :128].reshape(n, nb, 2, 64), 4).reshape(n, nb, 2, 4, 32)  # (half, quarter, 32)
        high = _bits(b[..., 128:192].reshape(n, nb, 2, 32), 2)  # (n, nb, 2, 4, 32)
        q = ((low | high << 4).float() - 32).reshape(n, nb, 16, 16)
        scale = _half(b, 208) * b[..., 192:208].contiguous().view(torch.int8).float()  # (n, nb, 16)
        return (scale.unsqueeze(-1) * q).reshape(n, nb, 256)
    sc, m = _k_scales(b[..., 4:16])
    ql = b[..., 48:] if type_name == "Q5_K" else b[..., 16:]  # 128 bytes of nibbles
    q = _bits(ql.reshape(n, nb, 4, 32), 4).reshape(n, nb, 8, 32)  # group g: bytes 32 (g / 2), nibble g & 1
    if type_name == "Q5_K":  # bit g of qh[i] is weight i of group g's fifth
        q = q | _bits(b[..., 16:48], 1) << 4
    scale, offset = _half(b, 0) * sc, _half(b, 2) * m  # (n, nb, 8) each, exact
    return (scale.unsqueeze(-1) * q.float() - offset.unsqueeze(-1)).reshape(n, nb, 256)


def dequantize_blocks(type_name: str, blocks: torch.Tensor) -> torch.Tensor:
    """(n, k) float32 from (n, k / block weights * block bytes) uint8 rows of `type_name` blocks."""
    n = blocks.shape[0]
    b = blocks.reshape(n, -1, BLOCK_BYTES[type_name])  # (n, blocks, bytes)
    if type_name in ("Q4_K", "Q5_K", "Q6_K"):
        return _k_weights(type_name, b).reshape(n, -1)
    d = _half(b, 0)  # (n, k/32, 1)
    if type_name == "Q8_0":
        q = b[..., 2:].contiguous().view(torch.int8).float()  # (n, k/32, 32)
        return (d * q).reshape(n, -1)
    qs = b[..., -16:]
    q = torch.cat((qs & 15, qs >> 4), dim=-1)  # (n, k/32, 32): low nibbles are weights 0..15
    if type_name == "Q5_0":  # bit i of qh[4] (little-endian) is weight i's fifth
        q = q | _bits(b[..., 2:6], 1).transpose(-1, -2).reshape(n, -1, 32) << 4
        return (d * (q.float() - 16)).reshape(n, -1)
    if type_name == "Q4_0":
        return (d * (q.float() - 8)).reshape(n, -1)
    return (d * q.float() + _half(b, 2)).reshape(n, -1)


def _head_bytes(type_name: str) -> int:
    """A block's head, moved as 2-byte fields: d, then m (Q4_1); d, dmin and the 12 bytes of 6-bit
    scales (Q4_K, Q5_K); the 16 int8 scales, then d (Q6_K) (c/blocks.h LB_TYPE_TABLE's head)."""
    return {"Q4_1": 4, "Q4_K": 16, "Q5_K": 16, "Q6_K": 18}.get(type_name, 2)


def _lead(type_name: str) -> int:
    """Where the head starts in the file's block (c/blocks.h `lead`): Q6_K keeps its scales and d after
    its 192 bytes of quants, so its grouped block is the file's rotated to start there."""
    return 192 if type_name == "Q6_K" else 0


def group_rows(type_name: str, blocks: torch.Tensor, in_place: bool = False) -> torch.Tensor:
    """The (n, k / 32 * bytes) file rows reordered into the kernel's groups of 8 rows (c/blocks.h) (n a multiple
    of 8), the same shape: per group and block, the 8 rows' d (and m), then chunks of 4 quant bytes
    of each row in turn. The scales move as int16 and the quants as int32 (4 bytes a chunk): a
    quarter of the elements a byte-wise transpose moves, which is most of a load's reordering time.
    `in_place` reorders `blocks` itself (contiguous, and the caller's own: a loader's read buffer), a
    few groups at a time through a copy of them, so a tensor is never held twice: the load's peak
    (tests/fast/kernels/test_file_size.py); in C (ggml_kernel.group_in_place) where the kernel built.
    ValueError for a type without the grouped layout (not in ggml_kernel.GROUPABLE)."""
    if type_name not in GROUPABLE:
        raise ValueError(f"{type_name} blocks have no grouped layout; the kernel groups {', '.join(GROUPABLE)}")
    n, row = blocks.shape
    size, h, lead = BLOCK_BYTES[type_name], _head_bytes(type_name), _lead(type_name)
    nb, groups, quants = row // size, n // GROUP, size - h
    if in_place and not blocks.is_contiguous():
        raise ValueError("group_rows in place needs contiguous rows")
    if in_place and ggml_kernel.kernel() is not None:  # one pass in C: a 1B file's load (`bench startup`)
        return ggml_kernel.group_in_place(type_name, blocks)
    out = blocks.view(groups, nb, GROUP * size) if in_place else torch.empty(groups, nb, GROUP * size, dtype=torch.uint8)
    step = max(1, (4 << 20) // (GROUP * row))  # groups at a time: a few MiB of temporaries, whatever the tensor
    for g in range(0, groups, step):
        b = blocks[g * GROUP:(g + step) * GROUP].reshape(-1, GROUP, nb, size)
        if lead:  # the head first (Q6_K: scales and d), then the quants; a copy
            b = torch.cat([b[..., lead:], b[..., :lead]], dim=-1)
        elif in_place:  # the groups' bytes are about to be overwritten
            b = b.clone()
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
    lead = _lead(type_name)
    if lead:  # the rotation undone: the quants, then the head
        b = torch.cat([b[..., size - lead:], b[..., :size - lead]], dim=-1)
    return b.transpose(1, 2).reshape(n, row)


class BlockLinear(nn.Module):
    """y = x W^T (+ b) with W the file's blocks of `type_name` (one of ggml_kernel.KEPT), never re-quantized.

    `blocks` are the file's rows in the file's order, or with `grouped` in group_rows' groups of 8
    rows (a GROUPABLE type; the loader groups them where the plan says so). `binding` is
    the function that multiplies, called as binding(type_name, blocks, x (m, k), grouped=...) ->
    (m, n) float32 (default: the ctypes kernel)."""

    def __init__(self, type_name: str, blocks: torch.Tensor, in_features: int, bias: torch.Tensor | None = None,
                 grouped: bool = False, binding=None):
        super().__init__()
        if type_name not in BLOCK_BYTES:
            raise ValueError(f"block type must be one of {', '.join(BLOCK_BYTES)}, got {type_name!r}")
        weights, size = SIZES[type_name]
        if in_features % weights or blocks.shape[-1] != in_features // weights * size:
            raise ValueError(f"{type_name} rows of {in_features} weights are {in_features / weights:g} blocks of "
                             f"{weights} weights in {size} bytes; got rows of {blocks.shape[-1]} bytes")
        if grouped and type_name not in GROUPABLE:
            raise ValueError(f"{type_name} blocks have no grouped layout; the kernel groups {', '.join(GROUPABLE)}")
        if grouped and blocks.shape[0] % GROUP:
            raise ValueError(f"grouped rows come in groups of {GROUP}; got {blocks.shape[0]} rows")
        self.register_buffer("blocks", blocks.contiguous())  # (n, k / weights * bytes) uint8, grouped or the file's
        self.register_buffer("bias", None if bias is None else bias.detach().float())
        self.type_name, self.in_features, self.out_features = type_name, in_features, blocks.shape[0]
        self.grouped, self.binding = grouped, binding or ggml_kernel.matmul

    def file_rows(self) -> torch.Tensor:
        """The file's bytes in the file's order: (n, k / block weights * bytes) uint8."""
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
    """An embedding table read from BlockLinear rows: a tied head's (one copy for both), or, with
    `owned`, an untied embedding's own file blocks (never a float table). Row i is that row's exact
    dequantization. `weight` is an empty tensor of the activation dtype, as in
    fast/kernels/quant.py's Int8Embedding: callers read it for the dtype and device."""

    def __init__(self, head: BlockLinear, dtype: torch.dtype = torch.float32, owned: bool = False):
        super().__init__()
        self.head, self.dtype = [head], dtype  # a list: not a submodule, so a tied head's blocks count once
        if owned:
            self.rows = head  # the embedding's own blocks: a submodule, so they are the model's
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
        whose = "its own" if hasattr(self, "rows") else "shared with the head"
        return f"{self.num_embeddings}, {self.embedding_dim}, {self.head[0].type_name} rows {whose}"

"""Weight-only int8 and int4 linear layers on PyTorch's packed CPU matmuls.

Decoding one token reads every weight once (module section 15.5), so fewer weight bytes mean
more tokens per second. The weights are stored quantized; activations stay in bfloat16; the
matmul reads the small integers directly, never a dequantized float copy. This is the scheme
of gpt-fast's `quantize.py`, on the same kernels:

    q8  per output row, symmetric:      W[n, :] ~= q[n, :] * s[n],        q in [-127, 127]
        torch.ops.aten._weight_int8pack_mm(x (m, k) bf16, q (n, k) int8, s (n,) bf16)
    q4  per group of `group_size` inputs, asymmetric (min/max):
                                        W[n, g] ~= (q - 8) * s[g, n] + z[g, n],   q in [0, 15]
        torch.ops.aten._weight_int4pack_mm_for_cpu(x bf16, packed, group_size, sz (k/gs, n, 2) bf16)
        with `packed` from _convert_weight_to_int4pack_for_cpu(q (n, k) int32, 1).
        The "- 8" is the kernel's convention (zero point in the middle of the range).

Why these choices (`llamablock bench decode` measures speed and perplexity per format):
  * the kernels are fast only with bfloat16 activations (float32/float16 inputs take much
    slower paths), so inputs are cast to bfloat16 and outputs back to the input dtype;
  * int4 group 32 matches the Q4_1 blocks of llama.cpp's file the model ships in (32 weights
    per block); larger groups cost perplexity;
  * the output head in 8 bits (even under q4) keeps greedy tokens equal to float32.
Prefill: the packed kernels work row by row of x, so their time grows linearly with the number
of tokens, while dequantizing to bfloat16 and calling the ordinary matmul costs a fixed
dequantization plus a GEMM whose per-row cost depends on the CPU (fast with AMX or AVX-512 BF16,
emulated with AVX2). From `crossover` rows on (a layer's argument), a layer dequantizes its
weight for that call (a transient bfloat16 copy, freed after) and runs the bfloat16 GEMM; decode
(one row) always reads only the small integers. The crossover is a choice per CPU kind
(PREFILL_BY_CPU, `llamablock bench prefill_crossover` measures it), made by the plan from its
Machine record (fast/machine.py) and handed to each layer; inside a compiled program it is PREFILL_ROWS,
so that one program holds every prompt length from there on (fast/compiled/static_engine.py). int4
reads the ids for this back out of the kernel's packed copy (fast/kernels/int4pack.py), so a layer holds
its weights once.
Error per weight: rounding to nearest gives |W - dequant(W)| <= s / 2 (s the row or group
step), plus the bfloat16 rounding of s and z (relative 2^-9). `dequantized()` returns the
float32 weight the kernel actually multiplies by, for tests and perplexity checks.
"""

from __future__ import annotations

import torch
from torch import nn

from llamablock.fast.formats import PACKED
from llamablock.fast.kernels import int4pack

PREFILL_ROWS = 32  # inside a compiled program, and on CPUs not measured: dequantize from this many rows on

# From how many rows of x the dequantized bf16 GEMM beats the packed kernel, per CPU kind
# (util/cpu.py) and format; None: never up to the 256 measured, so the kernel runs at every
# length. Read off `llamablock bench prefill_crossover` (BENCHMARKS.md, this CPU kind and its AVX2
# kernels with ATEN_CPU_CAPABILITY=avx2): on AVX-512 without AMX the dequantization costs many
# kernel rows, int4's several times int8's; on AVX2 the bf16 GEMM itself is slower per row than
# either kernel. AMX runs the bf16 GEMM in hardware: PREFILL_ROWS, the shortest prompt a compiled
# prefill takes.
PREFILL_BY_CPU = {"AMX": {"q8": PREFILL_ROWS, "q4": PREFILL_ROWS}, "AVX-512": {"q8": 64, "q4": 256},
                  "AVX2": {"q8": None, "q4": None}}


def prefill_rows(fmt: str, kind: str) -> int | None:
    """Rows of x from which a `fmt` layer (q8 or q4) runs the dequantized GEMM on a CPU of `kind`
    (util/cpu.py); None for never. PREFILL_ROWS on kinds not measured."""
    return PREFILL_BY_CPU.get(kind, {}).get(fmt, PREFILL_ROWS)


def _dequantizes(rows: int, crossover: int | None) -> bool:
    """For `rows` >= PREFILL_ROWS (the callers test that first, so a decode step pays no call). A
    compiled program holds every length from PREFILL_ROWS on, so it switches there."""
    if torch.compiler.is_compiling():
        crossover = PREFILL_ROWS
    return crossover is not None and rows >= crossover


def _check_2d(w: torch.Tensor) -> None:
    if len(w.shape) != 2:
        raise ValueError(f"a linear weight must be 2-D (out, in), got shape {tuple(w.shape)}")


def _row_chunks(n: int, k: int):
    """Row ranges of about a million weights: quantizing a chunk at a time keeps the float
    temporaries small (rows are quantized independently, so the result is the same)."""
    step = max(1, (1 << 20) // k)
    return ((i, min(i + step, n)) for i in range(0, n, step))


def _chunks(weight):
    """(first row, rows) of a tensor, or the chunks a RowChunks (io/gguf_read.py) reads from a file."""
    if not isinstance(weight, torch.Tensor):
        return iter(weight)
    return ((a, weight[a:b]) for a, b in _row_chunks(*weight.shape))


class Int8Linear(nn.Module):
    """y = x W^T (+ b) with W stored as int8 rows and one bfloat16 scale per row. `weight`: an
    (n, k) tensor, or a RowChunks, quantized as read, for a table too large to hold in float.
    `crossover`: rows of x from which it dequantizes for a GEMM (None: never; the plan's Machine)."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None, crossover: int | None = PREFILL_ROWS):
        super().__init__()
        self.crossover = crossover
        _check_2d(weight)
        n, k = weight.shape
        q = torch.empty(n, k, dtype=torch.int8)
        scale = torch.empty(n, dtype=torch.bfloat16)
        for a, rows in _chunks(weight):
            b, w = a + len(rows), rows.detach().float()
            s = (w.abs().amax(dim=1) / 127).clamp(min=torch.finfo(torch.float32).tiny)  # (rows,)
            scale[a:b] = s = s.to(torch.bfloat16)  # the kernel takes bf16 scales; quantize against those
            q[a:b] = torch.round(w / s.float()[:, None]).clamp(-127, 127).to(torch.int8)  # (rows, k)
        self.register_buffer("qweight", q)
        self.register_buffer("scales", scale)
        self.register_buffer("bias", None if bias is None else bias.detach().to(torch.bfloat16))
        self.in_features, self.out_features = k, n

    @property
    def kernel(self) -> bool:
        """Whether small batches use aten._weight_int8pack_mm: its AVX-512 path returns garbage
        (NaN, huge values) or crashes when k is not a multiple of 16 (torch 2.13), so such layers
        multiply by the dequantized weight; tests/fast/kernels/test_quant.py covers both widths."""
        return self.in_features % 16 == 0

    def dequantized(self) -> torch.Tensor:
        return self.qweight.float() * self.scales.float()[:, None]  # (n, k)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        x2 = x.reshape(-1, shape[-1]).to(torch.bfloat16)  # (m, k)
        if not self.kernel or (x2.shape[0] >= PREFILL_ROWS and _dequantizes(x2.shape[0], self.crossover)):
            y = x2 @ self.dequantized().to(torch.bfloat16).T  # (m, n), bf16 GEMM
        else:
            y = torch.ops.aten._weight_int8pack_mm(x2, self.qweight, self.scales)  # (m, n)
        if self.bias is not None:
            y = y + self.bias
        return y.reshape(*shape[:-1], self.out_features).to(x.dtype)

    def extra_repr(self) -> str:
        return f"in={self.in_features}, out={self.out_features}, int8 per-row"


class Int4Linear(nn.Module):
    """y = x W^T (+ b) with W in 4-bit groups of `group_size` inputs, bf16 scale and zero each;
    `crossover` as Int8Linear's."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None, group_size: int = 32,
                 crossover: int | None = PREFILL_ROWS):
        super().__init__()
        self.crossover = crossover
        _check_2d(weight)
        n, k = weight.shape
        if group_size not in (32, 64, 128, 256):
            raise ValueError(f"int4 group_size must be 32, 64, 128 or 256 (the kernel's), got {group_size}")
        if k % group_size:
            raise ValueError(f"int4 needs in_features ({k}) to be a multiple of group_size ({group_size})")
        q = torch.empty(n, k, dtype=torch.int32)  # the packing kernel takes the whole matrix as int32
        scale = torch.empty(n, k // group_size)
        zero = torch.empty(n, k // group_size)
        for a, b in _row_chunks(n, k):
            w = weight[a:b].detach().float().reshape(b - a, k // group_size, group_size)  # (rows, groups, gs)
            lo, hi = w.amin(-1), w.amax(-1)  # (rows, groups)
            scale[a:b] = s = ((hi - lo) / 15).clamp(min=1e-6).to(torch.bfloat16).float()
            zero[a:b] = z = (lo + 8 * s).to(torch.bfloat16).float()  # kernel: (q - 8) * s + z
            q[a:b] = torch.round((w - z[..., None]) / s[..., None] + 8).clamp(0, 15).to(torch.int32).reshape(b - a, k)
        self._pack(q, scale, zero, bias, group_size)

    @classmethod
    def from_ids(cls, q: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor, group_size: int = 32,
                 crossover: int | None = PREFILL_ROWS) -> Int4Linear:
        """A layer of given ids q (n, k) in 0..15 and per-group scale and zero (n, k / group_size), the
        kernel's weight (q - 8) * scale + zero with both rounded to bfloat16: for a file whose 4-bit
        groups are already this affine form (Q4_K, fast/kernels/kquant.py), kept instead of re-derived."""
        self = cls.__new__(cls)
        nn.Module.__init__(self)
        self.crossover = crossover
        self._pack(q.to(torch.int32), scale.float().to(torch.bfloat16).float(), zero.float().to(torch.bfloat16).float(),
                   None, group_size)
        return self

    def _pack(self, q: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor, bias: torch.Tensor | None,
              group_size: int) -> None:
        n, k = q.shape
        self.register_buffer("packed", torch.ops.aten._convert_weight_to_int4pack_for_cpu(q.contiguous(), 1))
        # prefill reads the ids back from `packed` (fast/kernels/int4pack.py); only where it cannot is a
        # second, nibble copy kept for it. The layout is kept as a constant for torch.compile.
        self.layout = int4pack.layout() if int4pack.readable(n, k) else None
        nibbles = None if self.layout else (q[:, 0::2] | (q[:, 1::2] << 4)).to(torch.uint8)  # (n, k/2)
        self.register_buffer("nibbles", nibbles)
        sz = torch.stack((scale, zero), dim=-1).transpose(0, 1)  # (groups, n, 2)
        self.register_buffer("scales_zeros", sz.to(torch.bfloat16).contiguous())
        self.register_buffer("bias", None if bias is None else bias.detach().to(torch.bfloat16))
        self.group_size, self.in_features, self.out_features = group_size, k, n

    def dequantized(self) -> torch.Tensor:
        """The float32 weight the kernel multiplies by: multiply the identity through it."""
        eye = torch.eye(self.in_features, dtype=torch.bfloat16)  # exact in bf16
        w_t = torch.ops.aten._weight_int4pack_mm_for_cpu(eye, self.packed, self.group_size, self.scales_zeros)
        return w_t.float().T.contiguous()  # (n, k); the kernel's bf16 output rounding included

    def ids(self) -> torch.Tensor:
        """The stored ids q in 0..15, (n, k) uint8: read from the kernel's packed copy, or the nibbles."""
        n, k = self.out_features, self.in_features
        if self.nibbles is not None:
            return torch.stack((self.nibbles & 15, self.nibbles >> 4), dim=-1).reshape(n, k)
        return int4pack.unpack(self.packed, n, k, *self.layout)

    def unpacked(self) -> torch.Tensor:
        """(q - 8) * s + z in float32: the kernel's weight before its bf16 rounding."""
        n, k, gs = self.out_features, self.in_features, self.group_size
        q = self.ids().reshape(n, k // gs, gs).float()
        s = self.scales_zeros[..., 0].T.float()[..., None]  # (n, groups, 1)
        z = self.scales_zeros[..., 1].T.float()[..., None]
        return ((q - 8) * s + z).reshape(n, k)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        x2 = x.reshape(-1, shape[-1]).to(torch.bfloat16)  # (m, k)
        if x2.shape[0] >= PREFILL_ROWS and _dequantizes(x2.shape[0], self.crossover):
            y = x2 @ self.unpacked().to(torch.bfloat16).T  # (m, n), bf16 GEMM
        else:
            y = torch.ops.aten._weight_int4pack_mm_for_cpu(x2, self.packed, self.group_size, self.scales_zeros)
        if self.bias is not None:
            y = y + self.bias
        return y.reshape(*shape[:-1], self.out_features).to(x.dtype)

    def extra_repr(self) -> str:
        return f"in={self.in_features}, out={self.out_features}, int4 group {self.group_size}"


class Int8Embedding(nn.Module):
    """An embedding table read from a tied head's Int8Linear rows: one int8 copy serves both.

    Row i is `head.dequantized()[i]` rounded to bfloat16, so each value is within half the
    row's step (plus the step's bfloat16 rounding) of the weight the head was quantized from.
    `weight` is an empty bfloat16 tensor on the table's device: callers read it for the
    activation dtype and device, and a full float table would cost the memory this saves.
    """

    def __init__(self, head: Int8Linear):
        super().__init__()
        self.register_buffer("qweight", head.qweight)  # (vocab, d) int8, the head's own tensor
        self.register_buffer("scales", head.scales)  # (vocab,) bf16
        self.num_embeddings, self.embedding_dim = head.out_features, head.in_features

    @property
    def weight(self) -> torch.Tensor:
        return torch.empty(0, dtype=torch.bfloat16, device=self.qweight.device)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        rows = self.qweight[ids].float() * self.scales[ids].float()[..., None]  # (..., d)
        return rows.to(torch.bfloat16)

    def extra_repr(self) -> str:
        return f"{self.num_embeddings}, {self.embedding_dim}, int8 rows shared with the head"


def quantize_linear(linear: nn.Linear, fmt: str, group_size: int = 32, prefill: dict | None = None) -> nn.Module:
    """`prefill`: {format: crossover} (fast/machine.py Machine.prefill); PREFILL_ROWS where absent."""
    crossover = (prefill or {}).get(fmt, PREFILL_ROWS)
    if fmt == "q8":
        return Int8Linear(linear.weight, linear.bias, crossover)
    if fmt == "q4":
        return Int4Linear(linear.weight, linear.bias, group_size, crossover)
    raise ValueError(f"quantization format must be one of {', '.join(PACKED)}, got {fmt!r}")


@torch.no_grad()
def quantize_model(model: nn.Module, fmt: str, group_size: int = 32, head: str = "q8",
                   prefill: dict | None = None) -> nn.Module:
    """Replace every nn.Linear of `model` in place; return the model.

    `head` is the format of the output projection `model.head` (8-bit by default, see above).
    A q4 layer whose input width is not a multiple of `group_size` falls back to q8. Embedding
    tables and norms are untouched (an embedding lookup reads one row per token, not the table).
    For speed, load the model in bfloat16 first: the remaining layers then run in bfloat16 too.
    `prefill` as quantize_linear's.
    """
    if fmt not in PACKED:
        raise ValueError(f"quantization format must be one of {', '.join(PACKED)}, got {fmt!r}")
    if head not in PACKED:
        raise ValueError(f"head format must be one of {', '.join(PACKED)}, got {head!r}")
    head_module = getattr(model, "head", None)
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if not isinstance(child, nn.Linear):
                continue
            f = head if child is head_module else fmt
            if f == "q4" and child.in_features % group_size:
                f = "q8"
            setattr(parent, name, quantize_linear(child, f, group_size, prefill))
    return model


def weight_bytes(model: nn.Module) -> int:
    """Bytes a decode step reads: parameters and buffers (quantized weights included), each tensor
    once, without int4's nibble copy (read only by prefill)."""
    seen, total = set(), 0
    buffers = [b for name, b in model.named_buffers() if not name.endswith("nibbles")]
    for t in list(model.parameters()) + buffers:
        if t.data_ptr() in seen:
            continue
        seen.add(t.data_ptr())
        total += t.numel() * t.element_size()
    return total


def apply_dtype(model: nn.Module, fmt: str, prefill: dict | None = None) -> nn.Module:
    """Quantize a model loaded with `formats.load_dtype(fmt)` when `fmt` is q8 or q4; else leave it."""
    return quantize_model(model, fmt, prefill=prefill) if fmt in PACKED else model

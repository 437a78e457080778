"""The static layout (llamablock.fast.compiled.static_decode) as an engine: StaticEngine runs it eagerly,
and the compiled engines change only how its step and prefill run.

    StaticEngine(model, fmt)     the static layout run eagerly: what the compiled engines are
                                 tested against
    InductorEngine(model, fmt)   its decode step compiled by torch.compile in this process
                                 (prefill eager; llamablock.fast.compiled.inductor_engine, for benchmarks)
    AOTIEngine(model, fmt)       step and prefill compiled ahead of time by AOTInductor into
                                 packages on disk that later processes load
                                 (llamablock.fast.compiled.aoti_engine): the engine of `llamablock generate --compile`
Each satisfies llamablock.runtime.engine's interface (prepare, prefill, step), batch 1, so
`generate` takes any of them in place of the model. With `batch` B > 1 the step decodes B
sequences, each at its own position (`step_rows`), and there is no compiled prefill: the server's
batch engine (llamablock.fast.compiled.batch_compiled) prefills eagerly and fills the rows.

`fmt` is "float32", "bfloat16" (the model's own dtype, checked) or "q8"/"q4": the fused weights
of the static layout are quantized (llamablock.fast.kernels.quant) after fusing, so q, k and v share one
int8 or int4 matrix, with the plan's prefill crossovers (`prefill`). The float model is kept: a
request longer than the cache rebuilds the static layout at the next power-of-two length
(static_decode.cache_length) from it (the fused layers of the other formats are reused as they are). "blocks" takes the model as the plan loads a GGUF of
the block kernel's types (Q4_0 ... Q8_0, the K types): its BlockLinear layers are fused as rows of blocks, never quantized again,
and keep the binding the plan gave them (the torch operator, for programs to call). `kv_dtype` is
the static cache's dtype (the plan's kv_dtype; default the model's), which the step reads upcast
to float32, and over blocks in place, through the kernel's operators (`in_place`; block_op.cpp).
"""


from __future__ import annotations

import copy

import torch

from llamablock.fast.compiled.static_decode import (
    StaticDecoder,
    cache_length,
    unsupported_reason,
)
from llamablock.fast.formats import FORMATS, PACKED, load_dtype
from llamablock.fast.kernels import block_op, cache_attention
from llamablock.fast.kernels.quant import PREFILL_ROWS, quantize_model

# The compiled prefill takes prompts of PREFILL_MIN to L - 1 tokens (L the cache length; a longer
# one would leave no slot to decode into) and pads shorter ones at their end to PREFILL_MIN. Why a
# minimum: q8/q4 layers switch to dequantized bfloat16 GEMMs at llamablock.fast.kernels.quant.PREFILL_ROWS
# rows, a branch on the length that a program for every length cannot hold (export would fix it).
PREFILL_MIN = PREFILL_ROWS


class StaticEngine:
    """The static layout of `model` in format `fmt`, run eagerly. The compiled engines below
    change only how `step` (and the prefill) run."""

    def __init__(self, model, fmt: str | None = None, batch: int = 1, prefill: dict | None = None,
                 kv_dtype: torch.dtype | None = None):
        reason = unsupported_reason(model.cfg)
        if reason is not None:
            raise ValueError(f"the compiled decoder does not support {reason}; run without compilation")
        dtype = model.embed.weight.dtype
        fmt = fmt or {torch.float32: "float32", torch.bfloat16: "bfloat16"}.get(dtype)
        if fmt not in FORMATS:
            raise ValueError(f"format must be one of {', '.join(FORMATS)}, got {fmt!r}")
        want = load_dtype(fmt)
        if dtype != want:
            raise ValueError(f"format {fmt} needs the model loaded in {want}, not {dtype}")
        if model.embed.weight.device.type != "cpu":
            raise ValueError(f"the compiled engine runs on the CPU; the model is on {model.embed.weight.device}")
        from llamablock.fast.kernels.file_blocks import BlockLinear

        kind = BlockLinear if fmt == "blocks" else torch.nn.Linear
        if any(not isinstance(getattr(layer.attn, "wq", None), kind) for layer in model.layers):
            raise ValueError("give the float model (the file's blocks for format blocks): the compiled decoder "
                             "fuses q/k/v before quantizing them")
        if batch <= 0:
            raise ValueError(f"batch must be a positive integer, got {batch!r}")
        self.model, self.cfg, self.fmt, self.batch = model, model.cfg, fmt, batch
        # over a file's blocks the kernel's operators are there (block_op.load()): steps read the 16-bit cache in
        # place, for heads the C takes
        cfg = self.cfg
        self.in_place = fmt == "blocks" and cache_attention.takes(cfg.head_dim, cfg.n_heads // cfg.n_kv_heads) \
            and block_op.load()
        self.kv_dtype = kv_dtype or dtype
        self.crossovers = prefill  # the packed layers' prefill crossovers (the plan's), for quantize_model
        self.static: StaticDecoder | None = None
        self._buckets: dict[int, tuple] = {}  # rows -> (static layout viewing that many rows, program or None)
        self.compile_seconds = 0.0
        self._ids = torch.zeros(batch, 1, dtype=torch.long)  # (B, 1): the step's tokens
        self._pos = torch.zeros(batch if batch > 1 else 1, dtype=torch.long)  # (B,) or (1,): their positions

    @property
    def length(self) -> int:
        return 0 if self.static is None else self.static.length

    device = torch.device("cpu")  # the packed kernels and AOTInductor's runner are the CPU's

    def covers(self, total_tokens: int) -> bool:
        """True when a request of `total_tokens` can prefill and decode without building or compiling."""
        return self.static is not None and total_tokens <= self.length and self._ready()

    def describe(self) -> str:
        return f"{self.fmt}, the static layout run eagerly"

    def start(self, total_tokens: int) -> None:
        """Make room for a request of `total_tokens` (prompt + new): rebuild if the cache is too short."""
        if total_tokens <= self.length:
            return
        length = cache_length(total_tokens, self.cfg.max_seq_len)
        with torch.no_grad():
            reuse = self.static.layers if self.static is not None and self.fmt not in PACKED else None
            static = StaticDecoder(self.model, length, batch=self.batch, kv_dtype=self.kv_dtype, layers=reuse,
                                   in_place=self.in_place)
            if self.fmt in PACKED:
                quantize_model(static, self.fmt, prefill=self.crossovers)
        self.static, self._buckets = static, {}
        self._built()

    def prepare(self, total_tokens: int) -> float:
        """Build (and compile) for `total_tokens` now, before any timing; seconds spent compiling."""
        self.start(total_tokens)
        before = self.compile_seconds
        if not self._ready():
            self._warm_up()
        return self.compile_seconds - before

    @torch.no_grad()
    def prefill(self, ids: torch.Tensor) -> torch.Tensor:
        """ids (1, t) at positions 0..t-1 -> logits (1, V)."""
        self.start(ids.shape[1] + 1)
        return self._prefill(ids)

    @torch.no_grad()
    def step_rows(self, ids: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        """A batch engine's step (batch B > 1): ids (B, 1), row i at position pos[i] of its own
        cache row (pos (B,) long) -> logits (B, V). llamablock.fast.compiled.batch_compiled fills the rows."""
        self._ids.copy_(ids)
        self._pos.copy_(pos)
        return self._step(self._ids, self._pos)

    @property
    def buckets(self) -> tuple[int, ...]:
        """The batch sizes a batch engine's steps run at: one row (a lone request reads one row of the
        cache, not `batch`) and `batch`."""
        return tuple(sorted({1, self.batch}))

    @torch.no_grad()
    def step_bucket(self, ids: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        """A batch engine's step at one of `buckets`: ids (b, 1) for the cache's first b rows, row i at
        position pos[i] ((b,), or (1,) when b is 1) -> logits (b, V)."""
        if ids.shape[0] == self.batch:
            return self.step_rows(ids, pos)
        view, program = self._bucket(ids.shape[0])
        return view.step(ids, pos) if program is None else program(ids.contiguous(), pos.contiguous())

    def _bucket(self, rows: int) -> tuple:
        """(the static layout over the cache's first `rows` rows, its step program or None): the same
        weights, and cache tensors that are views of the batch's, so the program writes the batch's
        rows; made on first use. For one row the program is the one `generate` builds (the same
        weights, shapes and cache length make the same package)."""
        if rows not in self._buckets:
            view, cache = copy.copy(self.static), copy.copy(self.static.cache)
            cache.keys = [t[:rows] for t in self.static.cache.keys]
            cache.values = [t[:rows] for t in self.static.cache.values]
            view.cache, view.batch = cache, rows
            self._buckets[rows] = (view, self._bucket_program(view, rows))
        return self._buckets[rows]

    def _bucket_program(self, view, rows: int):
        """A compiled step for `view` (None: run it eagerly)."""
        return None

    @torch.no_grad()
    def step(self, ids: torch.Tensor, pos: int) -> torch.Tensor:
        """ids (1, 1) at position `pos` (all earlier positions filled) -> logits (1, V)."""
        if not 0 <= pos < self.length:
            raise ValueError(f"position {pos} is outside the cache (0..{self.length - 1}); call start() first")
        # The program's inputs are always these two tensors: a caller's slice of a longer sequence
        # has other strides, and dynamo would compile again for them.
        self._ids.copy_(ids)
        self._pos.fill_(pos)
        return self._step(self._ids, self._pos)

    # What the compiled engines replace -----------------------------------------------------
    def _built(self) -> None:
        """Called after a new static layout is built."""

    def _ready(self) -> bool:
        return True

    def _warm_up(self) -> None:
        pass

    def _prefill(self, ids: torch.Tensor) -> torch.Tensor:
        return self.static.prefill(ids)

    def _step(self, ids: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        return self.static.step(ids, pos)

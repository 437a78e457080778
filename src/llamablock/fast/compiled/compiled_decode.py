"""The fast engines: the static layout (llamablock.fast.compiled.static_decode) run eagerly or compiled.

    StaticEngine(model, fmt)     the static layout run eagerly: what the compiled engines are
                                 tested against
    InductorEngine(model, fmt)   its decode step compiled by torch.compile in this process
                                 (prefill eager; llamablock.fast.compiled.inductor_engine, for benchmarks)
    AOTIEngine(model, fmt)       step and prefill compiled ahead of time by AOTInductor into
                                 packages on disk that later processes load (llamablock.fast.compiled.aoti_step):
                                 the engine of `llamablock generate --compile`
Each satisfies llamablock.runtime.engine's interface (prepare, prefill, step), batch 1, so
`generate` takes any of them in place of the model. With `batch` B > 1 the step decodes B
sequences, each at its own position (`step_rows`), and there is no compiled prefill: the server's
batch engine (llamablock.fast.compiled.batch_compiled) prefills eagerly and fills the rows.

`fmt` is "float32", "bfloat16" (the model's own dtype, checked) or "q8"/"q4": the fused weights
of the static layout are quantized (llamablock.fast.kernels.quant) after fusing, so q, k and v share one
int8 or int4 matrix. The float model is kept: a request longer than the cache rebuilds the static
layout at the next power-of-two length (static_decode.cache_length) from it. "blocks" takes the
model as fast/kernels/native.py loads a GGUF of Q4_0/Q4_1/Q8_0 blocks: its BlockLinear layers are fused
as rows of blocks, never quantized again, and the programs call the block kernel as an operator
(fast/kernels/block_op.py), so the compiled and the eager model compute with the same bytes.

Compilation uses inductor with freezing (weights become constants, prepacked for the CPU's GEMMs)
and, with `autotune`, max-autotune restricted to its C++ GEMM templates, which fuse the int8 and
int4 scales into the matmul (llamablock.fast.compiled.build_options; `llamablock bench decode` measures each
choice). Where a setting cannot build on this CPU, AOTIEngine tries the next of
build_options.attempts and, when none builds, runs that program eagerly: one line (`notify`) says
what failed and what runs instead, never a traceback. `inductor` adds inductor settings (e.g.
{"cpp.enable_kernel_profile": True} for a per-kernel profile). `compile_seconds` adds up the time
spent compiling (0 for packages loaded from disk).
"""

from __future__ import annotations

import copy
import sys
import time

import torch

from llamablock.fast.compiled.build_options import attempts
from llamablock.fast.compiled.static_decode import (
    StaticDecoder,
    cache_length,
    unsupported_reason,
)
from llamablock.fast.formats import FORMATS, PACKED, load_dtype
from llamablock.fast.kernels import block_op
from llamablock.fast.kernels.quant import PREFILL_ROWS, quantize_model

# The compiled prefill takes prompts of PREFILL_MIN to L - 1 tokens (L the cache length; a longer
# one would leave no slot to decode into) and pads shorter ones at their end to PREFILL_MIN. Why a
# minimum: q8/q4 layers switch to dequantized bfloat16 GEMMs at llamablock.fast.kernels.quant.PREFILL_ROWS
# rows, a branch on the length that a program for every length cannot hold (export would fix it).
PREFILL_MIN = PREFILL_ROWS


class StaticEngine:
    """The static layout of `model` in format `fmt`, run eagerly. The compiled engines below
    change only how `step` (and the prefill) run."""

    def __init__(self, model, fmt: str | None = None, batch: int = 1):
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
            static = StaticDecoder(self.model, length, batch=self.batch)
            if self.fmt in PACKED:
                quantize_model(static, self.fmt)
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


class AOTIEngine(StaticEngine):
    """Step and prefill as AOTInductor programs (llamablock.fast.compiled.aoti_step), loaded from the disk
    cache or compiled on first use at each cache length.

    The prefill is one program for every prompt length PREFILL_MIN .. L - 1 (shorter prompts are
    padded at their end); `compile_prefill=False` prefills eagerly, and so does a context too short
    for the program's lengths. Each program's library carries its own copy of the frozen weights.
    `huge_pages` (default on) moves the step's copy of the weights into 2 MiB pages when it is
    loaded (llamablock.fast.compiled.huge_pages; `llamablock bench huge_pages` measures it side by side).
    A program whose settings fail to build falls back through build_options.attempts, then to the
    eager static layout; `notify` gets one line each time (default: printed on stderr), and
    `describe()` says what runs.
    `weights_id` (builds.weights_identity) names the packages instead of the weights' hash (aoti_step.weights_name).
    """

    def __init__(self, model, fmt: str | None = None, *, autotune: bool = True, inductor: dict | None = None,
                 compile_prefill: bool = True, huge_pages: bool = True, notify=None, batch: int = 1,
                 weights_id: str | None = None):
        super().__init__(model, fmt, batch)
        self.weights_id = weights_id
        self.autotune, self.inductor = autotune, inductor
        self.compile_prefill, self.huge_pages = compile_prefill, huge_pages
        self.notify = notify or (lambda line: print(line, file=sys.stderr, flush=True))
        self._step_program = self._prefill_program = None
        self._digest: str | None = None
        self.running: dict[str, str] = {}  # method (or "step x<rows>") -> the attempt's name that runs it, or "eager"
        if self.fmt == "blocks" and not block_op.load():  # programs call it by name: registered before any loads
            self.notify(f"the block operator did not build ({block_op.why_not()}): the programs cannot call the blocks")

    def _built(self) -> None:
        self._step_program = self._prefill_program = self._digest = None
        self.running = {}

    def _bucket_program(self, view, rows: int):
        example = (torch.zeros(rows, 1, dtype=torch.long), torch.zeros(rows, dtype=torch.long))  # (1,) at one row
        return self._first_that_builds("step", view, example, None, self.huge_pages,
                                       f"the decode step for {rows} row{'s' if rows > 1 else ''}", f"step x{rows}")

    def _compiles_prefill(self) -> bool:
        """Whether prefill runs as a compiled program: a cache long enough for its lengths
        PREFILL_MIN .. L - 1 and its example length L / 2 to hold PREFILL_MIN."""
        return self.compile_prefill and self.batch == 1 and self.length > 2 * PREFILL_MIN

    def _ready(self) -> bool:
        return "step" in self.running and ("prefill" in self.running or not self._compiles_prefill())

    def _warm_up(self) -> None:
        self.build(self.length)

    def build(self, total_tokens: int, report=lambda stage: None) -> float:
        """Load or compile both programs for `total_tokens`, calling `report` with each stage's name
        before it runs (`llamablock compile` prints them); seconds spent compiling."""
        before = self.compile_seconds
        report(f"the static layout in {self.fmt} for {cache_length(total_tokens, self.cfg.max_seq_len)} tokens")
        self.start(total_tokens)
        report("the decode step" + (f" for {self.batch} rows" if self.batch > 1 else ""))
        self._program("step")
        for rows in self.buckets[:-1]:
            report(f"the decode step for {rows} row{'s' if rows > 1 else ''}")
            self._bucket(rows)
        if self._compiles_prefill():
            report("the prefill")
            self._program("prefill")
        return self.compile_seconds - before

    def packages(self) -> list:
        """The package directories of the programs built so far (none for a program run eagerly)."""
        programs = [self._step_program, self._prefill_program, *(p for _, p in self._buckets.values())]
        return [p.path for p in programs if p is not None]

    def describe(self) -> str:
        """What runs, for the summary line: the format, and the programs' settings where they are
        not the first choice (a fallback), were chosen for this CPU, or run eagerly; said once when
        every program runs the same way."""
        said = {}
        for method, name in self.running.items():
            first = attempts(self.fmt, method.split(" ")[0], self.autotune, self.inductor)[0]
            if name == "eager":
                said[method] = "run eagerly: no setting built on this CPU"
            elif name != first.name or first.why:
                said[method] = name + (f": {first.why}" if name == first.name and first.why else "")
        if not said:
            return f"{self.fmt}, compiled"
        if len(set(said.values())) == 1 and len(said) == len(self.running):
            return f"{self.fmt}, compiled ({next(iter(said.values()))})"
        label = {"step": "decode step", "prefill": "prefill"}
        return f"{self.fmt}, compiled ({'; '.join(f'{label.get(m, m)}: {w}' for m, w in said.items())})"

    def _program(self, method: str):
        """The AOTInductor program for `method` at this length: loaded from the cache or compiled,
        with the first of build_options.attempts that builds; None when none does (eager)."""
        if method in self.running:
            return self._step_program if method == "step" else self._prefill_program
        if method == "step":
            example, lengths, huge = (self._ids, self._pos), None, self.huge_pages
        else:
            example = (torch.zeros(1, self.length // 2, dtype=torch.long), torch.zeros(1, dtype=torch.long))
            lengths, huge = (PREFILL_MIN, self.length - 1), False
        program = self._first_that_builds(method, self.static, example, lengths, huge,
                                          "the decode step" if method == "step" else "the prefill", method)
        if method == "step":
            self._step_program = program
        else:
            self._prefill_program = program
        return program

    def _first_that_builds(self, method: str, static, example: tuple, lengths, huge: bool, what: str, key: str):
        """The AOTInductor program of `static.<method>`, with the first of build_options.attempts that
        builds (one line per failure to `notify`), recorded in `running[key]`; None (eager) when none does."""
        from llamablock.fast.compiled.aoti_step import AOTIProgram, BuildFailed, weights_name

        self._digest = self._digest or weights_name(self.static, self.weights_id)  # one for every program
        tried = attempts(self.fmt, method, self.autotune, self.inductor)
        for i, attempt in enumerate(tried):
            t = time.perf_counter()
            try:
                program = AOTIProgram(static, self.fmt, attempt.options, method, example, self._digest,
                                      lengths=lengths, huge_pages=huge)
            except BuildFailed as e:
                self.compile_seconds += time.perf_counter() - t
                instead = tried[i + 1].name if i + 1 < len(tried) else "the static layout run eagerly"
                if e.remembered:  # said in full when it failed; a later start says it briefly
                    self.notify(f"[{what} in {self.fmt}: {attempt.name} failed to build here before; {instead} instead]")
                else:
                    self.notify(f"[{what} in {self.fmt} cannot be built with {attempt.name} on this CPU ({e}); "
                                f"trying {instead} instead]")
                continue
            self.compile_seconds += program.compile_seconds
            self.running[key] = attempt.name
            return program
        self.running[key] = "eager"
        return None

    def _prefill(self, ids: torch.Tensor) -> torch.Tensor:
        t = ids.shape[1]
        if not self._compiles_prefill() or self._program("prefill") is None:
            return self.static.prefill(ids)
        if t < PREFILL_MIN:  # padded at its end (StaticDecoder.prefill says why that is safe)
            ids = torch.cat([ids, ids.new_zeros(1, PREFILL_MIN - t)], dim=1)
        return self._program("prefill")(ids.contiguous(), torch.tensor([t - 1]))

    def _step(self, ids: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        program = self._program("step")
        return self.static.step(ids, pos) if program is None else program(ids, pos)

"""The fast engines: the static layout (llamablock.fast.static_decode) run eagerly or compiled.

    StaticEngine(model, fmt)     the static layout run eagerly: what the compiled engines are
                                 tested against
    InductorEngine(model, fmt)   its decode step compiled by torch.compile in this process
                                 (prefill eager); re-traced in every new process
    AOTIEngine(model, fmt)       step and prefill compiled ahead of time by AOTInductor into
                                 packages on disk that later processes load (llamablock.fast.aoti_step):
                                 the engine of `llamablock generate --compile`
Each satisfies llamablock.runtime.engine's interface (prepare, prefill, step), batch 1, so
`generate` takes any of them in place of the model.

`fmt` is "float32", "bfloat16" (the model's own dtype, checked) or "q8"/"q4": the fused weights
of the static layout are quantized (llamablock.fast.quant) after fusing, so q, k and v share one
int8 or int4 matrix. The float model is kept: a request longer than the cache rebuilds the static
layout at the next power-of-two length (static_decode.cache_length) from it.

Compilation uses inductor with freezing (weights become constants, prepacked for the CPU's GEMMs)
and, with `autotune`, max-autotune restricted to its C++ GEMM templates, which fuse the int8 and
int4 scales into the matmul; `step_options` and `prefill_options` adjust that per program
(`llamablock bench decode` measures each choice). `inductor` adds inductor settings (e.g.
{"cpp.enable_kernel_profile": True} for a per-kernel profile). `compile_seconds` adds up the time
spent compiling (0 for packages loaded from disk).
"""

from __future__ import annotations

import time

import torch

from llamablock.fast.quant import (
    DTYPE_CHOICES,
    FORMATS,
    PREFILL_ROWS,
    load_dtype,
    quantize_model,
)
from llamablock.fast.static_decode import (
    StaticDecoder,
    cache_length,
    unsupported_reason,
)

# The compiled prefill takes prompts of PREFILL_MIN to L - 1 tokens (L the cache length; a longer
# one would leave no slot to decode into) and pads shorter ones at their end to PREFILL_MIN. Why a
# minimum: q8/q4 layers switch to dequantized bfloat16 GEMMs at llamablock.fast.quant.PREFILL_ROWS
# rows, a branch on the length that a program for every length cannot hold (export would fix it).
PREFILL_MIN = PREFILL_ROWS
REALIZE_OPS = 8  # the decode step's realize_opcount_threshold (step_options says why)


def inductor_options(autotune: bool, extra: dict | None = None) -> dict:
    """The inductor settings of both compiled engines: freezing, and with `autotune` the C++ GEMM templates."""
    options = {"freezing": True}
    if autotune:
        options.update({"max_autotune": True, "max_autotune_gemm_backends": "CPP"})
    return {**options, **(extra or {})}


def prefill_options(options: dict) -> dict:
    """The prefill's settings: with autotuning, ATen's GEMMs (oneDNN, MKL) compete with the C++
    templates, since its matmuls have t rows, not one. The templates are tuned for a length of L / 2."""
    if options.get("max_autotune"):
        return {**options, "max_autotune_gemm_backends": "CPP,ATEN"}
    return options


def step_options(fmt: str, options: dict) -> dict:
    """The decode step's settings, chosen by side-by-side runs of SmolLM2's step (`llamablock bench decode`).

    float32 with autotuning: MKL's matrix-vector product (aten.mm on the weights as they are,
    `cpp.weight_prepack` off) in place of the C++ templates, which stream float32 weights slower at
    one row. The other formats keep the templates, which fuse the int8/int4 scales into the matmul.
    Every format, with autotuning: inductor keeps a pointwise result as a buffer once it takes more
    than REALIZE_OPS ops (`realize_opcount_threshold`, default 30) instead of recomputing it where it
    is read; with the default, the attention kernel recomputed q's RoPE for every cached key inside
    the scores' reduction. The useful window is narrow: a change to the step's RoPE expression
    should measure it again (the generated attention kernel shows whether q is loaded or recomputed
    inside the loop over cached keys)."""
    if not options.get("max_autotune"):
        return options
    options = {**options, "realize_opcount_threshold": REALIZE_OPS}
    if fmt == "float32":
        kept = {k: v for k, v in options.items() if not k.startswith("max_autotune")}
        return {**kept, "cpp.weight_prepack": False}
    return options


class StaticEngine:
    """The static layout of `model` in format `fmt`, run eagerly. The compiled engines below
    change only how `step` (and the prefill) run."""

    def __init__(self, model, fmt: str | None = None):
        reason = unsupported_reason(model.cfg)
        if reason is not None:
            raise ValueError(f"the compiled decoder does not support {reason}; run without compilation")
        dtype = model.embed.weight.dtype
        fmt = fmt or {torch.float32: "float32", torch.bfloat16: "bfloat16"}.get(dtype)
        if fmt not in DTYPE_CHOICES:
            raise ValueError(f"format must be one of {', '.join(DTYPE_CHOICES)}, got {fmt!r}")
        want = load_dtype(fmt)
        if dtype != want:
            raise ValueError(f"format {fmt} needs the model loaded in {want}, not {dtype}")
        if model.embed.weight.device.type != "cpu":
            raise ValueError(f"the compiled engine runs on the CPU; the model is on {model.embed.weight.device}")
        if any(not isinstance(getattr(layer.attn, "wq", None), torch.nn.Linear) for layer in model.layers):
            raise ValueError("give the float model: the compiled decoder fuses q/k/v before quantizing them")
        self.model, self.cfg, self.fmt = model, model.cfg, fmt
        self.static: StaticDecoder | None = None
        self.compile_seconds = 0.0
        self._ids = torch.zeros(1, 1, dtype=torch.long)  # (1, 1): the step's token
        self._pos = torch.zeros(1, dtype=torch.long)  # (1,): its position

    @property
    def length(self) -> int:
        return 0 if self.static is None else self.static.length

    device = torch.device("cpu")  # the packed kernels and AOTInductor's runner are the CPU's

    def covers(self, total_tokens: int) -> bool:
        """True when a request of `total_tokens` can prefill and decode without building or compiling."""
        return self.static is not None and total_tokens <= self.length and self._ready()

    def start(self, total_tokens: int) -> None:
        """Make room for a request of `total_tokens` (prompt + new): rebuild if the cache is too short."""
        if total_tokens <= self.length:
            return
        length = cache_length(total_tokens, self.cfg.max_seq_len)
        with torch.no_grad():
            static = StaticDecoder(self.model, length)
            if self.fmt in FORMATS:
                quantize_model(static, self.fmt)
        self.static = static
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


class InductorEngine(StaticEngine):
    """The step compiled by torch.compile in this process, once per cache length; prefill eager."""

    def __init__(self, model, fmt: str | None = None, *, autotune: bool = True, inductor: dict | None = None):
        super().__init__(model, fmt)
        self.options = step_options(self.fmt, inductor_options(autotune, inductor))
        self._compiled = None
        self._compiled_lengths: set[int] = set()

    def _built(self) -> None:
        self._compiled = torch.compile(self.static.step, fullgraph=True, dynamic=False)

    def _ready(self) -> bool:
        return self.length in self._compiled_lengths

    def _warm_up(self) -> None:
        self.step(torch.zeros(1, 1, dtype=torch.long), 0)  # slot 0, overwritten by the next prefill

    def _step(self, ids: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        import torch._inductor.config

        first = self.length not in self._compiled_lengths
        t = time.perf_counter()
        # A config patch in force at every call (should dynamo ever recompile): compilation happens
        # inside the first call, and torch.compile(options=...) did not apply freezing (weights
        # stayed graph inputs, and the C++ GEMM templates, which need constant weights, offered nothing).
        with torch._inductor.config.patch(self.options):
            out = self._compiled(ids, pos)
        if first:
            self.compile_seconds += time.perf_counter() - t
            self._compiled_lengths.add(self.length)
        return out


class AOTIEngine(StaticEngine):
    """Step and prefill as AOTInductor programs (llamablock.fast.aoti_step), loaded from the disk
    cache or compiled on first use at each cache length.

    The prefill is one program for every prompt length PREFILL_MIN .. L - 1 (shorter prompts are
    padded at their end); `compile_prefill=False` prefills eagerly, and so does a context too short
    for the program's lengths. Each program's library carries its own copy of the frozen weights.
    `huge_pages` (default on) moves the step's copy of the weights into 2 MiB pages when it is
    loaded (llamablock.fast.huge_pages; `llamablock bench huge_pages` measures it side by side).
    """

    def __init__(self, model, fmt: str | None = None, *, autotune: bool = True, inductor: dict | None = None,
                 compile_prefill: bool = True, huge_pages: bool = True):
        super().__init__(model, fmt)
        self.options = inductor_options(autotune, inductor)
        self.compile_prefill, self.huge_pages = compile_prefill, huge_pages
        self._step_program = self._prefill_program = None
        self._digest: str | None = None

    def _built(self) -> None:
        self._step_program = self._prefill_program = self._digest = None

    def _compiles_prefill(self) -> bool:
        """Whether prefill runs as a compiled program: a cache long enough for its lengths
        PREFILL_MIN .. L - 1 and its example length L / 2 to hold PREFILL_MIN."""
        return self.compile_prefill and self.length > 2 * PREFILL_MIN

    def _ready(self) -> bool:
        return self._step_program is not None and (self._prefill_program is not None or not self._compiles_prefill())

    def _warm_up(self) -> None:
        self.build(self.length)

    def build(self, total_tokens: int, report=lambda stage: None) -> float:
        """Load or compile both programs for `total_tokens`, calling `report` with each stage's name
        before it runs (`llamablock compile` prints them); seconds spent compiling."""
        before = self.compile_seconds
        report(f"the static layout in {self.fmt} for {cache_length(total_tokens, self.cfg.max_seq_len)} tokens")
        self.start(total_tokens)
        report("the decode step")
        self._program("step")
        if self._compiles_prefill():
            report("the prefill")
            self._program("prefill")
        return self.compile_seconds - before

    def packages(self) -> list:
        """The package directories of the programs built so far."""
        return [p.path for p in (self._step_program, self._prefill_program) if p is not None]

    def _program(self, method: str):
        """The AOTInductor program for `method` at this length: loaded from the cache or compiled."""
        from llamablock.fast.aoti_step import AOTIProgram, weights_digest

        if method == "step" and self._step_program is not None:
            return self._step_program
        if method == "prefill" and self._prefill_program is not None:
            return self._prefill_program
        if self._digest is None:
            self._digest = weights_digest(self.static)  # one hash of the weights for both programs
        if method == "step":
            program = AOTIProgram(self.static, self.fmt, step_options(self.fmt, self.options), "step",
                                  (self._ids, self._pos), self._digest, huge_pages=self.huge_pages)
            self._step_program = program
        else:
            example = (torch.zeros(1, self.length // 2, dtype=torch.long), torch.zeros(1, dtype=torch.long))
            program = AOTIProgram(self.static, self.fmt, prefill_options(self.options), "prefill", example,
                                  self._digest, lengths=(PREFILL_MIN, self.length - 1))
            self._prefill_program = program
        self.compile_seconds += program.compile_seconds
        return program

    def _prefill(self, ids: torch.Tensor) -> torch.Tensor:
        t = ids.shape[1]
        if not self._compiles_prefill():
            return self.static.prefill(ids)
        if t < PREFILL_MIN:  # padded at its end (StaticDecoder.prefill says why that is safe)
            ids = torch.cat([ids, ids.new_zeros(1, PREFILL_MIN - t)], dim=1)
        return self._program("prefill")(ids.contiguous(), torch.tensor([t - 1]))

    def _step(self, ids: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        return self._program("step")(ids, pos)

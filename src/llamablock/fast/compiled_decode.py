"""The fast generation engine: a StaticDecoder with its decode step and prefill compiled.

    engine = CompiledDecoder(model, fmt="q8")     # model: a Decoder in float32 or bfloat16
    generate(engine, prompt_ids, ...)             # llamablock.runtime.generate takes it in place of the model

`fmt` is "float32", "bfloat16" (the model's own dtype, checked) or "q8"/"q4": the fused weights of
the static layout are quantized (llamablock.fast.quant) after fusing, so q, k and v share one int8 or
int4 matrix. The float model is kept: a request longer than the cache rebuilds the static layout
at the next power-of-two length (llamablock.fast.static_decode.cache_length) from it.

Compilation (`backend`): "aoti" (the default) exports the step, and the prefill with the prompt
length symbolic (one program for every length), and compiles each ahead of time with AOTInductor
into a package on disk, named by a hash of the weights, which later processes load instead of
compiling (llamablock.fast.aoti_step; BENCHMARKS.md's compile_cache table gives the start-up of a second
run). Each program is loaded or compiled when first used at a cache length. "inductor" is
torch.compile in this process, which re-traces the step in every new process and launches its
kernels from Python (3.9 ms of a SmolLM2 q8 step, with dynamo's guards, in BENCHMARKS.md's kernel profile); it prefills
eagerly. Both use inductor with freezing (weights become constants, prepacked for the CPU's GEMMs)
and max-autotune restricted to its C++ GEMM templates, which the speed issue's probe found stable
and which fuse the int8 scale into the matmul (measured here on SmolLM2-135M, q8 under
torch.compile: 94 tokens/s against 58 with inductor's default mode; compiling takes about 80 s
instead of 30); `step_options` adjusts the step per format (float32: MKL's GEMV on unpacked
weights). `autotune=False` chooses the default mode. The prefill lets ATen's GEMMs (oneDNN, MKL)
compete too (`prefill_options`).
`compile_prefill=False` prefills eagerly (so do the inductor backend and a context too short for
the program's lengths, PREFILL_MIN). Each program's library carries its own copy of the frozen
weights, so disk and memory hold the weights once more per program and cache length.
`compile_seconds` adds up the time spent compiling (0 for packages loaded from disk).
`compile=False` runs the same static layout eagerly: the reference the tests compare against.
`inductor` adds inductor settings (e.g. {"cpp.enable_kernel_profile": True} for a per-kernel profile).
`huge_pages` (default on) moves the AOTInductor step's copy of the weights into 2 MiB pages when it
is loaded (llamablock.fast.huge_pages; `llamablock bench huge_pages` measures it side by side).
"""

from __future__ import annotations

import time

import torch

from llamablock.fast.quant import DTYPE_CHOICES, FORMATS, PREFILL_ROWS, load_dtype, quantize_model
from llamablock.fast.static_decode import StaticDecoder, cache_length, unsupported_reason

BACKENDS = ("inductor", "aoti")  # torch.compile in this process, or an AOTInductor package (llamablock.fast.aoti_step)
# The compiled prefill takes prompts of PREFILL_MIN to L - 1 tokens (L the cache length; a longer
# one would leave no slot to decode into) and pads shorter ones at their end to PREFILL_MIN. Why a
# minimum: q8/q4 layers switch to dequantized bfloat16 GEMMs at llamablock.fast.quant.PREFILL_ROWS rows,
# a branch on the length that a program for every length cannot hold (export would have to fix it).
# SmolLM2, 512 tokens, against transformers in one run here (BENCHMARKS.md has the suite's run):
# float32 1.19x (eager 0.93x), bfloat16 1.67x (1.08x), q8 1.73x (0.73x), q4 1.78x (0.50x); the
# earlier chunks of 128 tokens attending over the whole cache under a mask reached 1.03-1.09x.
PREFILL_MIN = PREFILL_ROWS
REALIZE_OPS = 8  # the decode step's realize_opcount_threshold (step_options says why)


def prefill_options(options: dict) -> dict:
    """The prefill's settings: with autotuning, ATen's GEMMs compete with the C++ templates. Its
    matmuls have t rows, not one, where oneDNN/MKL can win (a float32 prefill here was 1.37x slower
    with the C++ templates alone than eagerly). The templates are tuned for a length of L / 2."""
    if options.get("max_autotune"):
        return {**options, "max_autotune_gemm_backends": "CPP,ATEN"}
    return options


def step_options(fmt: str, options: dict) -> dict:
    """The decode step's settings, chosen by side-by-side runs of SmolLM2's step here.

    float32 with autotuning: MKL's matrix-vector product (aten.mm on the weights as they are,
    `cpp.weight_prepack` off) in place of the C++ templates, which stream float32 weights slower
    at one row: 1.13-1.18x faster in three runs (inductor's default oneDNN-packed linear was
    slower than the templates: 21.2 against 26.9 tok/s). The other formats keep the templates
    (they fuse the int8/int4 scales; ATen's bfloat16 matrix-vector product read 9 GB/s). At one
    row each of their matmuls has a single template candidate (the q8 step: 121 selections, one
    choice each), so autotuning times nothing there. A wider search (max_autotune_gemm_search_space
    EXHAUSTIVE, set here until 2026-11-30 after side-by-side gains of 1.06-1.17x) generated
    byte-identical step kernels in bfloat16, q8 and q4 when checked, so those gains were the
    spread between runs, and the setting is gone.

    Every format, with autotuning: inductor keeps a pointwise result as a buffer once it takes more than 8 ops
    (`realize_opcount_threshold`, default 30) instead of recomputing it where it is read. With the
    default, the attention kernel recomputed q's RoPE (and a bounds check on `pos`) for every cached
    key inside the scores' reduction. Side by side here: q8 at cache length 2048 1.34x (threshold 6:
    1.27x; 10 and 12: no gain; 4: 0.70x, other fusions broke), at 256 1.04x; bfloat16 1.07x; float32
    unchanged. The window is narrow (10 gained nothing): a change to the step's RoPE expression
    should measure it again (llamablock.fast.static_decode; the generated attention kernel shows whether
    q is loaded or recomputed inside the loop over cached keys)."""
    if not options.get("max_autotune"):
        return options
    options = {**options, "realize_opcount_threshold": REALIZE_OPS}
    if fmt == "float32":
        kept = {k: v for k, v in options.items() if not k.startswith("max_autotune")}
        return {**kept, "cpp.weight_prepack": False}
    return options


def inductor_options(autotune: bool, extra: dict | None = None) -> dict:
    """The inductor settings of both backends: freezing, and with `autotune` the C++ GEMM templates."""
    options = {"freezing": True}
    if autotune:
        options.update({"max_autotune": True, "max_autotune_gemm_backends": "CPP"})
    return {**options, **(extra or {})}


class CompiledDecoder:
    """Prefill and decode with one compiled program each per cache length; batch 1."""

    def __init__(self, model, fmt: str | None = None, *, compile: bool = True, autotune: bool = True,
                 inductor: dict | None = None, backend: str = "aoti", compile_prefill: bool = True,
                 huge_pages: bool = True):
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
        if any(not isinstance(getattr(layer.attn, "wq", None), torch.nn.Linear) for layer in model.layers):
            raise ValueError("give the float model: the compiled decoder fuses q/k/v before quantizing them")
        if backend not in BACKENDS:
            raise ValueError(f"backend must be one of {', '.join(BACKENDS)}, got {backend!r}")
        # The compiled prefill is an AOTInductor program; torch.compile would re-trace it per process.
        self.compile_prefill = compile_prefill and compile and backend == "aoti"
        self.model, self.cfg, self.fmt, self.backend = model, model.cfg, fmt, backend
        self.compile, self.autotune, self.huge_pages = compile, autotune, huge_pages
        self.inductor = dict(inductor or {})  # more inductor settings (the benchmark's kernel profile)
        self.static: StaticDecoder | None = None
        self._step = self._prefill = None
        self._digest: str | None = None
        self.compile_seconds = 0.0
        self._compiled_lengths: set[int] = set()
        self._ids = torch.zeros(1, 1, dtype=torch.long)  # (1, 1): the step's token
        self._pos = torch.zeros(1, dtype=torch.long)  # (1,): its position

    @property
    def length(self) -> int:
        return 0 if self.static is None else self.static.length

    def covers(self, total_tokens: int) -> bool:
        """True when a request of `total_tokens` can prefill and decode without building or compiling."""
        if self.static is None or total_tokens > self.length:
            return False
        if not self.compile:
            return True
        if self.backend == "inductor":
            return self.length in self._compiled_lengths
        return self._step is not None and (self._prefill is not None or not self._compiles_prefill())

    def start(self, total_tokens: int) -> None:
        """Make room for a request of `total_tokens` (prompt + new): rebuild if the cache is too short.
        AOTInductor programs are loaded or compiled on first use (`warm_up` does both now)."""
        if total_tokens <= self.length:
            return
        length = cache_length(total_tokens, self.cfg.max_seq_len)
        with torch.no_grad():
            static = StaticDecoder(self.model, length)
            if self.fmt in FORMATS:
                quantize_model(static, self.fmt)
        self.static, self._step, self._prefill, self._digest = static, None, None, None
        if self.backend == "inductor" or not self.compile:
            self._step = torch.compile(static.step, fullgraph=True, dynamic=False) if self.compile else static.step

    def _compiles_prefill(self) -> bool:
        """Whether prefill runs as a compiled program: AOTI, and a cache long enough for its lengths
        PREFILL_MIN .. L - 1 and its example length L / 2 (`_aoti`) to hold PREFILL_MIN; a context
        capped below that, e.g. a 64-token toy, prefills eagerly."""
        return self.compile_prefill and self.length > 2 * PREFILL_MIN

    def _prefill_program(self):
        """The compiled prefill at this length, loaded or compiled on first use."""
        if self._prefill is None:
            self._prefill = self._aoti("prefill")
        return self._prefill

    def _aoti(self, method: str):
        """The AOTInductor program for `method` at this length: loaded from the cache or compiled."""
        from llamablock.fast.aoti_step import AOTIProgram, weights_digest

        if self._digest is None:
            self._digest = weights_digest(self.static)  # one hash of the weights for both programs
        options = inductor_options(self.autotune, self.inductor)
        if method == "step":
            program = AOTIProgram(self.static, self.fmt, step_options(self.fmt, options), "step", (self._ids, self._pos),
                                  self._digest, huge_pages=self.huge_pages)
        else:
            example = (torch.zeros(1, self.length // 2, dtype=torch.long), torch.zeros(1, dtype=torch.long))
            program = AOTIProgram(self.static, self.fmt, prefill_options(options), "prefill", example, self._digest,
                                  lengths=(PREFILL_MIN, self.length - 1))
        self.compile_seconds += program.compile_seconds
        return program

    @torch.no_grad()
    def prefill(self, ids: torch.Tensor) -> torch.Tensor:
        """ids (1, t) at positions 0..t-1 -> logits (1, vocab)."""
        t = ids.shape[1]
        self.start(t + 1)
        if not self._compiles_prefill():
            return self.static.prefill(ids)
        if t < PREFILL_MIN:  # padded at its end (StaticDecoder.prefill says why that is safe)
            ids = torch.cat([ids, ids.new_zeros(1, PREFILL_MIN - t)], dim=1)
        return self._prefill_program()(ids.contiguous(), torch.tensor([t - 1]))

    @torch.no_grad()
    def step(self, ids: torch.Tensor, pos: int) -> torch.Tensor:
        """ids (1, 1) at position `pos` (all earlier positions filled) -> logits (1, vocab)."""
        if not 0 <= pos < self.length:
            raise ValueError(f"position {pos} is outside the cache (0..{self.length - 1}); call start() first")
        # The graph's inputs are always these two tensors: a caller's slice of a longer sequence has
        # other strides, and dynamo would compile again for them.
        self._ids.copy_(ids)
        self._pos.fill_(pos)
        ids, pos_t = self._ids, self._pos
        if self.compile and self.backend == "aoti" and self._step is None:
            self._step = self._aoti("step")
        if not self.compile or self.backend == "aoti":
            return self._step(ids, pos_t)
        first = self.length not in self._compiled_lengths
        t = time.perf_counter()
        # A config patch in force at every call (should dynamo ever recompile): compilation happens
        # inside the first call, and torch.compile(options=...) did not apply freezing here (weights
        # stayed graph inputs, and the C++ GEMM templates, which need constant weights, offered nothing).
        import torch._inductor.config

        with torch._inductor.config.patch(step_options(self.fmt, inductor_options(self.autotune, self.inductor))):
            out = self._step(ids, pos_t)
        if first:
            self.compile_seconds += time.perf_counter() - t
            self._compiled_lengths.add(self.length)
        return out

    def warm_up(self, total_tokens: int) -> float:
        """Compile for `total_tokens` now (one step on slot 0, overwritten by the next prefill; the
        prefill program is loaded or compiled); seconds taken."""
        self.start(total_tokens)
        before = self.compile_seconds
        self.step(torch.zeros(1, 1, dtype=torch.long), 0)
        if self._compiles_prefill():
            self._prefill_program()
        return self.compile_seconds - before

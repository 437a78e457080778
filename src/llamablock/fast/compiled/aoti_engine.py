"""AOTIEngine: the static layout's step and prefill compiled ahead of time by AOTInductor into
packages on disk (llamablock.fast.compiled.aoti_step) that later processes load: the engine of
`llamablock generate --compile`.

Compilation uses inductor with freezing (weights become constants, prepacked for the CPU's GEMMs)
and, with `autotune`, max-autotune restricted to its C++ GEMM templates, which fuse the int8 and
int4 scales into the matmul (llamablock.fast.compiled.build_options; `llamablock bench decode` measures each
choice). Where a setting cannot build on this CPU, AOTIEngine tries the next of
build_options.attempts and, when none builds, runs that program eagerly: one line (`notify`) says
what failed and what runs instead, never a traceback. `inductor` adds inductor settings (e.g.
{"cpp.enable_kernel_profile": True} for a per-kernel profile). `compile_seconds` adds up the time
spent compiling (0 for packages loaded from disk). Over a file's own blocks the programs call the
block kernel as a torch operator (fast/kernels/block_op.py), bound by the plan before the weights
were read, so the compiled and the eager model compute with the same bytes.
"""

from __future__ import annotations

import sys
import time

import torch

from llamablock.fast.compiled.build_options import attempts
from llamablock.fast.compiled.static_decode import cache_length
from llamablock.fast.compiled.static_engine import PREFILL_MIN, StaticEngine


class AOTIEngine(StaticEngine):
    """Step and prefill as AOTInductor programs (llamablock.fast.compiled.aoti_step), loaded from the disk
    cache or compiled on first use at each cache length.

    The prefill is one program for every prompt length PREFILL_MIN .. L - 1 (shorter prompts are
    padded at their end); `compile_prefill=False` prefills eagerly, and so does a context too short
    for the program's lengths. Each program's library carries its own copy of the frozen weights,
    except over a file's blocks, where both read the static layout's (aoti_step.SHARED_WEIGHT_FORMATS).
    `huge_pages` (default on) moves the step's copy of the weights into 2 MiB pages when it is
    loaded (llamablock.fast.compiled.huge_pages; `llamablock bench huge_pages` measures it side by side).
    A program whose settings fail to build falls back through build_options.attempts, then to the
    eager static layout; `notify` gets one line each time (default: printed on stderr), and
    `describe()` says what runs.
    `weights_id` (builds.weights_identity) names the packages instead of the weights' hash (aoti_step.weights_name).
    """

    def __init__(self, model, fmt: str | None = None, *, autotune: bool = True, inductor: dict | None = None,
                 compile_prefill: bool = True, huge_pages: bool = True, notify=None, batch: int = 1,
                 weights_id: str | None = None, prefill: dict | None = None, kv_dtype: torch.dtype | None = None):
        super().__init__(model, fmt, batch, prefill, kv_dtype)
        self.weights_id = weights_id
        self.autotune, self.inductor = autotune, inductor
        self.compile_prefill, self.huge_pages = compile_prefill, huge_pages
        self.notify = notify or (lambda line: print(line, file=sys.stderr, flush=True))
        self._step_program = self._prefill_program = None
        self._digest: str | None = None
        self.running: dict[str, str] = {}  # method (or "step x<rows>") -> the attempt's name that runs it, or "eager"

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

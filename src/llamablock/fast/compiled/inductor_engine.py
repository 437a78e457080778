"""The static layout's decode step compiled by torch.compile in this process (prefill eager).

Re-traced in every new process, so `generate` uses AOTIEngine (llamablock.fast.compiled.static_engine)
instead; benchmarks use this one to compare settings without packages on disk
(`llamablock bench decode`).
"""

from __future__ import annotations

import sys
import time

import torch

from llamablock.fast.compiled.build_options import attempts
from llamablock.fast.compiled.static_engine import StaticEngine


class InductorEngine(StaticEngine):
    """The step compiled by torch.compile in this process, once per cache length; prefill eager.
    Settings that fail to build fall back as AOTIEngine's do (build_options.attempts, then eager)."""

    def __init__(self, model, fmt: str | None = None, *, autotune: bool = True, inductor: dict | None = None,
                 notify=None):
        super().__init__(model, fmt)
        self._tries = attempts(self.fmt, "step", autotune, inductor)
        self.notify = notify or (lambda line: print(line, file=sys.stderr, flush=True))
        self._compiled = None
        self._compiled_lengths: set[int] = set()

    @property
    def options(self) -> dict | None:
        """The inductor settings in use; None once every attempt failed (the step runs eagerly)."""
        return self._tries[0].options if self._tries else None

    def _built(self) -> None:
        self._compiled = torch.compile(self.static.step, fullgraph=True, dynamic=False)

    def _ready(self) -> bool:
        return self.length in self._compiled_lengths

    def _warm_up(self) -> None:
        self.step(torch.zeros(1, 1, dtype=torch.long), 0)  # slot 0, overwritten by the next prefill

    def _step(self, ids: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        import torch._inductor.config

        if not self._tries:
            return self.static.step(ids, pos)
        first = self.length not in self._compiled_lengths
        t = time.perf_counter()
        try:
            # A config patch in force at every call (should dynamo ever recompile): compilation happens
            # inside the first call, and torch.compile(options=...) did not apply freezing (weights
            # stayed graph inputs, and the C++ GEMM templates, which need constant weights, offered nothing).
            with torch._inductor.config.patch(self.options):
                out = self._compiled(ids, pos)
        except Exception as e:  # inductor's errors have no common base class short of Exception
            if not first:
                raise
            from llamablock.fast.compiled.aoti_step import one_line

            failed = self._tries.pop(0)
            instead = self._tries[0].name if self._tries else "the static layout run eagerly"
            self.notify(f"[the decode step in {self.fmt} cannot be built with {failed.name} on this CPU "
                        f"({one_line(e)}); trying {instead} instead]")
            self._built()
            return self._step(ids, pos)
        if first:
            self.compile_seconds += time.perf_counter() - t
            self._compiled_lengths.add(self.length)
        return out

"""What generation does when the sequence fills the context (`generate --context-overflow`).

    stop    the default: a request longer than the context is refused before it starts
            (request.check_request), as before, and the summary line says so
    shift   llama.cpp's context shift: keep the first `keep` tokens (its --keep), drop the oldest
            half of the rest, go on (ShiftEngine, here)
    sinks   StreamingLLM: the first 4 tokens and the most recent ones, positions inside the cache
            (studies/grouped_cache.py GroupedEngine)

ShiftEngine shifts by recomputation: the kept tokens are prefilled again at their new positions.
llama.cpp instead re-rotates the cached keys by the shift (its K-shift), which keeps the deeper
layers' states that were computed while the dropped tokens were still there; recomputing gives
exactly what a fresh model given the kept tokens gives (tested), at the cost of one prefill of at
most a context's tokens per half-context of new tokens. Both bound the cache by the context.
"""

from __future__ import annotations

import torch

POLICIES = ("stop", "shift", "sinks")
SINK_TOKENS = 4  # StreamingLLM's attention sinks (Xiao et al. 2023, section 3.2: four suffice)


class ShiftEngine:
    """`engine` (runtime/engine.py's interface) with llama.cpp's context shift past `context` tokens.
    `tokens` is the window the cache holds now; `shifts` counts the shifts so far."""

    unbounded = True  # a generation may run past any context

    def __init__(self, engine, context: int, keep: int = 0):
        if not 0 <= keep < context - 1:
            raise ValueError(f"--keep must be between 0 and {context - 2} (the context is {context} tokens), got {keep}")
        self.inner, self.context, self.keep = engine, context, keep
        self.cfg, self.device = engine.cfg, engine.device
        self.tokens: list[int] = []
        self.shifts = 0

    def prepare(self, total_tokens: int) -> None:
        self.inner.prepare(min(total_tokens, self.context))

    def covers(self, total_tokens: int) -> bool:
        return self.inner.covers(min(total_tokens, self.context))

    def describe(self) -> str:
        return f"{self.inner.describe()}; context shift past {self.context} tokens, keeping the first {self.keep}"

    def prefill(self, ids: torch.Tensor) -> torch.Tensor:
        """A prompt longer than the context (a chat's history) is cut as a shift would leave it: the
        first `keep` tokens and the most recent ones, in a window a shift's size."""
        self.tokens = ids[0].tolist()
        if len(self.tokens) > self.context:
            recent = self.context + 1 - (self.context - self.keep) // 2 - self.keep
            self.tokens = self.tokens[:self.keep] + self.tokens[-recent:]
            ids = torch.tensor([self.tokens], device=self.device)
        return self.inner.prefill(ids)

    def step(self, ids: torch.Tensor, pos: int) -> torch.Tensor:
        """`pos` is the token's place in the whole sequence; the cache's place is the window's."""
        self.tokens.append(int(ids[0, 0]))
        if len(self.tokens) <= self.context:
            return self.inner.step(ids, len(self.tokens) - 1)
        # llama.cpp (examples/main): n_left = n_past - n_keep, n_discard = n_left / 2, drop the
        # tokens n_keep .. n_keep + n_discard - 1; here the cache is full (n_past = context).
        discard = (self.context - self.keep) // 2
        self.tokens = self.tokens[:self.keep] + self.tokens[self.keep + discard:]
        self.shifts += 1
        return self.inner.prefill(torch.tensor([self.tokens], device=self.device))

"""The engine interfaces that generation and serving talk to, and the eager engines behind them.

An engine runs one sequence of batch 1 through a model with a cache:

    engine.cfg                        the model's ModelConfig
    engine.device                     where its tensors live (token ids are made there)
    engine.prepare(total_tokens)      make room for prompt + new tokens: allocate, build, compile
                                      (before any timing starts)
    engine.prefill(ids (1, t))        the prompt at positions 0..t-1 -> logits (1, V) of the last
    engine.step(ids (1, 1), pos)      one token at position pos -> logits (1, V)
    engine.covers(total_tokens)       whether a request of that length runs without building or
                                      compiling anything first (the eager engines: always)
    engine.describe()                 the weights and how they run, in one line (the summary)

`EagerEngine` is the Decoder with its KVCache, the reference every other engine is tested
against; `RecomputeEngine` keeps no cache and runs the whole sequence at every step (the
definition that a cache must reproduce). The compiled engines of llamablock.fast satisfy the
same interface, so `generate` never imports them (mlx-lm's models never import its generate).

A batch engine decodes several sequences ("rows") together, each joining and leaving between
steps: what the server's scheduler runs (llamablock.web.scheduler), whatever the engine.

    engine.device, engine.max_rows    where token ids are made; the most rows at once (None: any)
    engine.rows                       the sequences decoding, in the order `step` takes and returns
    engine.add(prompt_ids, n)         a new sequence (a Row), to be prefilled before it joins
    engine.prefill_next(waiting)      one prefill forward for some of the waiting rows ->
                                      [(row, logits (1, V))] for those that joined the batch
    engine.step(tokens (b,))          one token per row -> logits (b, V)
    engine.remove(row)                the row leaves (finished or cancelled)
    engine.describe()                 how the rows run, in a few words (the server's start-up line)
A Row (llamablock.runtime.batch) is read for its `prompt_tokens`, `length` (tokens in the cache)
and `index` (its place in the batch; None until it joins).

`EagerBatchEngine` (llamablock.runtime.batch) runs the eager Decoder; CompiledBatchEngine
(llamablock.fast.compiled.batch_compiled) a compiled step, its rows beside the eager engine's.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol, Sequence, runtime_checkable

import torch

from llamablock.config import ModelConfig
from llamablock.kv_cache import KVCache

if TYPE_CHECKING:
    from llamablock.runtime.batch import Row


class Engine(Protocol):
    cfg: ModelConfig
    device: torch.device

    def prepare(self, total_tokens: int) -> None: ...

    def covers(self, total_tokens: int) -> bool: ...

    def describe(self) -> str: ...

    def prefill(self, ids: torch.Tensor) -> torch.Tensor: ...

    def step(self, ids: torch.Tensor, pos: int) -> torch.Tensor: ...


@runtime_checkable
class BatchEngine(Protocol):
    device: torch.device
    max_rows: int | None
    rows: list[Row]

    def describe(self) -> str: ...

    def add(self, prompt_ids: Sequence[int], max_new_tokens: int) -> Row: ...

    def prefill_next(self, waiting: Sequence[Row]) -> list[tuple[Row, torch.Tensor]]: ...

    def step(self, tokens: torch.Tensor) -> torch.Tensor: ...

    def remove(self, row: Row) -> None: ...


class EagerEngine:
    """A Decoder with a KVCache that grows (doubling) with the tokens actually generated, up to the
    request's length: a request may allow the whole context and stop early at end-of-sequence. The
    cache is kept in `kv_dtype` (the plan's; default the model's dtype)."""

    FIRST = 256  # cache slots allocated before the first growth

    def __init__(self, model, what: str | None = None, kv_dtype: torch.dtype | None = None):
        self.model, self.cfg, self.what = model, model.cfg, what  # what: the weights' formats, said by describe()
        self.kv_dtype = kv_dtype or model.embed.weight.dtype
        self.cache: KVCache | None = None
        self.total = 0

    def covers(self, total_tokens: int) -> bool:
        return True

    def describe(self) -> str:
        return self.what or str(self.model.embed.weight.dtype).removeprefix("torch.")

    @property
    def device(self) -> torch.device:
        return self.model.embed.weight.device

    def prepare(self, total_tokens: int) -> None:
        self.total = total_tokens
        self.cache = KVCache(self.cfg, 1, min(total_tokens, self.FIRST), dtype=self.kv_dtype,
                             device=self.model.embed.weight.device)

    def _room(self, tokens: int) -> None:
        if tokens > self.cache.max_len:
            size = min(max(tokens, 2 * self.cache.max_len), max(self.total, tokens))
            try:
                self.cache.grow(size)
            except (RuntimeError, MemoryError) as e:  # the allocator's refusal, as a request's limit
                need = self.cache.nbytes() / self.cache.max_len * size / 2**30
                raise ValueError(f"the KV cache for {size} tokens needs {need:.2f} GiB, more than this machine can "
                                 f"allocate now; ask for fewer tokens (--max-new-tokens) ({e})") from None

    def prefill(self, ids: torch.Tensor) -> torch.Tensor:
        self.cache.reset()
        self._room(ids.shape[1])
        return self.model(ids, cache=self.cache, last_only=True)[:, -1]

    def step(self, ids: torch.Tensor, pos: int) -> torch.Tensor:
        self._room(pos + 1)
        return self.model(ids, cache=self.cache)[:, -1]  # the cache knows the position


class RecomputeEngine:
    """No cache: every step runs the whole sequence so far (a reference, slow by design)."""

    def __init__(self, model):
        self.model, self.cfg = model, model.cfg
        self.seq: torch.Tensor | None = None

    def covers(self, total_tokens: int) -> bool:
        return True

    def describe(self) -> str:
        return "recomputed without a cache"

    @property
    def device(self) -> torch.device:
        return self.model.embed.weight.device

    def prepare(self, total_tokens: int) -> None:
        self.seq = None

    def prefill(self, ids: torch.Tensor) -> torch.Tensor:
        self.seq = ids
        return self.model(ids, last_only=True)[:, -1]

    def step(self, ids: torch.Tensor, pos: int) -> torch.Tensor:
        self.seq = torch.cat([self.seq[:, :pos], ids], dim=1)  # (1, pos + 1)
        return self.model(self.seq, last_only=True)[:, -1]

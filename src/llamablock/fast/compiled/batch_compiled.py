"""Continuous batching with a compiled decode step: the server's rows decoded by one program for B rows.

The eager batch engine (llamablock.runtime.batch) pays a Python call and a dispatch for every op of
every layer at every step, whatever the batch; here the step of B sequences is the static layout's
step compiled once (AOTIEngine with batch=B, built by `llamablock compile --batch B` or by `serve
--compile-tokens`). `llamablock bench serve` measures both side by side. An engine built for one
sequence (B = 1, `llamablock compile`) serves `--parallel 1` the same way, with one compiled row.

Layout: the static cache gives each sequence a row of L slots of its own, its token i in slot i,
and the step writes row r's key and value at slot pos[r], reads the slots up to the longest row's
position and masks those after row r's own (StaticDecoder.step with one position per row): no
alignment to a shared frontier, nothing shifted. The rows in use are always the first k (a row that leaves takes the last row's slots),
and a step runs the smallest of the engine's `buckets` that holds them: a lone request runs the
one-row program (the one `generate` runs), more run the B-row one, where a free row runs token 0
at position 0 and its output is dropped (its slot 0 is overwritten when a sequence takes it).

Prefill is the eager batch engine's (prompts that arrive together in one padded forward, a long
one in chunks) on the served eager model; when a prompt is done, the eager engine hands its keys
and values to `place`, which copies them into a free row's slots [0, n). An engine for one
sequence has a prefill of its own, which `generate` runs too: a prompt that starts there while
the compiled row is free is prefilled by it, straight into that row. A request the compiled rows
cannot hold (prompt + max_tokens over L, or every row taken) joins the eager batch instead, and a
step then runs both; `rows` lists the compiled rows first.

Exactness: the eager model and the static layout hold the same weights (q/k/v and gate/up are fused
before quantizing, and q8/q4 quantize each output row on its own, so fusing changes no integer and
no scale); they sum in other orders, so a row's logits equal its run alone to float rounding
(tests/fast/compiled/test_batch_compiled.py states the tolerance).
"""

from __future__ import annotations

from typing import Sequence

import torch

from llamablock.runtime.batch import BatchKVCache, EagerBatchEngine, Row


class CompiledBatchEngine:
    """A batch engine (llamablock.runtime.engine.BatchEngine) over a compiled step for
    `compiled.batch` rows; `model` is the served eager model, which prefills and decodes the rows
    the compiled step cannot hold (`eager`, an EagerBatchEngine that hands each prefilled row to
    `_place` first)."""

    def __init__(self, model, compiled, chunk: int = 256):
        if compiled.batch < 1 or compiled.static is None:
            raise ValueError("give a prepared compiled engine (AOTIEngine(batch=B), prepared for its length)")
        self.model, self.cfg, self.compiled = model, model.cfg, compiled
        self.eager = EagerBatchEngine(model, rows=compiled.batch, chunk=chunk, place=self._place,
                                      kv_dtype=compiled.kv_dtype)  # the rows it hands over keep their rounding
        self.max_rows = self.eager.max_rows
        self.slots: list[Row | None] = [None] * compiled.batch  # the sequence in each compiled row
        self._total: dict[int, int] = {}  # id(row) -> prompt + max new tokens

    @property
    def device(self) -> torch.device:
        return self.eager.device

    @property
    def rows(self) -> list[Row]:
        """The sequences decoding: the compiled rows in row order, then the eager batch's."""
        return [r for r in self.slots if r is not None] + self.eager.rows

    def describe(self) -> str:
        sizes = " and ".join(map(str, self.compiled.buckets))
        steps = "step for 1 row" if self.compiled.buckets == (1,) else f"steps for {sizes} rows"
        return (f"the compiled {steps} ({self.compiled.describe()}; requests of up to "
                f"{self.compiled.length} tokens), the rest eagerly")

    def add(self, prompt_ids: Sequence[int], max_new_tokens: int) -> Row:
        row = self.eager.add(prompt_ids, max_new_tokens)
        self._total[id(row)] = len(prompt_ids) + max_new_tokens
        return row

    def prefill_next(self, waiting: Sequence[Row]) -> list[tuple[Row, torch.Tensor]]:
        """The oldest row on the compiled engine's own prefill where it has one (one sequence) and
        the row fits, else the eager batch engine's prefill_next."""
        first = waiting[0]
        if self.compiled.batch == 1 and first.length == 0 and self._free(first) is not None:
            logits = self.compiled.prefill(first.ids)  # (1, V); slots [0, n) of the one row filled
            first.length = first.prompt_tokens
            self._take(first, 0)
            return [(first, logits)]
        return self.eager.prefill_next(waiting)

    @torch.no_grad()
    def step(self, tokens: torch.Tensor) -> torch.Tensor:
        """tokens (b,), one per row in `rows` order -> logits (b, V)."""
        rows = self.rows
        if tokens.shape != (len(rows),):
            raise ValueError(f"step takes one token per row: {len(rows)}, got shape {tuple(tokens.shape)}")
        k = sum(r is not None for r in self.slots)  # the compiled rows in use: slots 0..k-1
        out = []
        if k:
            b = next(n for n in self.compiled.buckets if n >= k)
            ids = torch.zeros(b, 1, dtype=torch.long)  # (b, 1); free rows: token 0 at position 0
            pos = torch.zeros(b, dtype=torch.long)  # (b,)
            ids[:k, 0] = tokens[:k].cpu()
            pos[:k] = torch.tensor([self.slots[i].length for i in range(k)])
            out.append(self.compiled.step_bucket(ids, pos)[:k].to(self.device))  # (k, V)
            for i in range(k):
                self.slots[i].length += 1
        if self.eager.rows:
            out.append(self.eager.step(tokens[k:]))
        return torch.cat(out) if len(out) > 1 else out[0]

    def remove(self, row: Row) -> None:
        self._total.pop(id(row), None)
        i = row.index
        if i is None or i >= len(self.slots) or self.slots[i] is not row:
            self.eager.remove(row)
            return
        last = max(j for j, r in enumerate(self.slots) if r is not None)
        if last != i:  # the last row moves into the gap: the rows in use stay 0..k-1
            moved, cache = self.slots[last], self.compiled.static.cache
            for buf in cache.keys + cache.values:
                buf[i, :, :moved.length] = buf[last, :, :moved.length]
            self.slots[i], moved.index = moved, i
        self.slots[last], row.index = None, None

    def _free(self, row: Row) -> int | None:
        """The compiled row that `row` would take: the first free one, if its request fits in L slots."""
        free = next((s for s, r in enumerate(self.slots) if r is None), None)
        fits = self.compiled.covers(self._total.get(id(row), self.compiled.length + 1))
        return free if fits else None

    def _take(self, row: Row, slot: int) -> None:
        self.slots[slot] = row
        row.solo, row.index = None, slot

    def _place(self, row: Row, src: BatchKVCache, i: int, end: int) -> bool:
        """The eager engine's `place`: a prefilled row into a free compiled row when it fits, its
        slots [end - n, end) of row i of `src` into slots [0, n) of the static cache."""
        free = self._free(row)
        if free is None:
            return False
        n, cache = row.length, self.compiled.static.cache
        for dst, held in ((cache.keys, src.all_keys), (cache.values, src.all_values)):
            for d, s in zip(dst, held, strict=True):
                d[free, :, :n] = s[i, :, end - n: end]
        self._take(row, free)
        return True

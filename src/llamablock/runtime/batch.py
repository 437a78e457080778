"""Continuous batching on the eager Decoder: several sequences decoded as one batch, each in its
own row of a batched KV cache, joining and leaving between steps (what llama.cpp's server calls
slots and vLLM "continuous batching", Yu et al., Orca, OSDI 2022).

Layout: right-aligned rows, left-padded. Every row's newest token sits in the same cache slot,
`frontier - 1`; a row of n tokens holds slots [frontier - n, frontier) and the slots before it
are padding that `pad_mask` hides. So a decode step writes every row's new key and value in slot
`frontier`, one cache update for the batch, as the Decoder's KVCache does; each row's position
id is its own length, so RoPE turns each row at its own positions, and the masks that read slot
distances (causal order, a sliding window, ALiBi) read the row's own token distances
(llamablock.attention builds them from cache slots).

    add      a new sequence, prefilled alone in a cache of its own, `chunk` tokens per `prefill`
             call, so a scheduler can run the other rows' decode steps between its chunks
    prefill  its next chunk; after the last, the sequence joins: its cache is copied into the
             next free row (a prompt longer than the frontier shifts the rows right first), unless
             the `place` callback takes it elsewhere (the compiled rows of
             llamablock.fast.compiled.batch_compiled, which holds this engine)
    prefill_next  what a scheduler calls: the prompts that arrived together and fit in `chunk`
             tokens (padding included) in one forward, left-padded to the longest, else the next
             chunk of the oldest. A forward's fixed costs (a packed layer's dequantization past
             fast.quant.prefill_rows, the per-layer overhead) are then paid once for all of them:
             four clients that arrive at once get their first tokens after one prefill, not four
             (`llamablock bench serve`'s first-token times).
    step     one token for every row: logits (b, V), rows in the order of `rows`
    remove   a row leaves: the last row moves into its place, so the rows in use are always
             0..b-1 and the cache hands attention a view of them, never a gathered copy
It satisfies llamablock.runtime.engine.BatchEngine, the interface the server's scheduler runs.

The buffers grow by doubling as EagerEngine's cache does; when they are full, padding that all
rows share (a long row has left) is dropped first by shifting left. With no row left they are
released, so an idle server holds no cache.

Exactness: a row computes what it would alone, up to the order of float sums (padding keys get a
softmax weight of exactly 0; tests/runtime/test_batch.py compares with EagerEngine in float32).
The q8/q4 layers of llamablock.fast.kernels.quant multiply row by row below PREFILL_ROWS rows, so a decode
batch smaller than that gives each row its alone result bit for bit, as do the steps in C (`c_step`:
tests/fast/kernels/test_decode_step_batch.py); a prompt prefilled in chunks
runs each chunk through the kernel its size picks, which may differ from the kernel of the whole
prompt at once, and so may change a quantized model's text. Not for
RoPE whose frequencies follow the sequence's length (dynamic NTK, LongRoPE: `Rotary.follows_length`),
which would take the batch's longest row: such a model gets one row at a time (`max_rows`), its
prompt in one pass, as transformers' generate prefills it (chunks would turn it at shorter lengths).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import torch

from llamablock.config import ModelConfig
from llamablock.kv_cache import KVCache
from llamablock.runtime.request import check_request


class BatchKVCache:
    """Keys and values (P, n_kv, L, hd) per layer for P rows, of which the first `rows` are in use.
    A llamablock.kv_cache.Cache: `length` is the frontier, `update` writes the rows in use (views,
    `keys`/`values`), and there is no ring (`key_slots` None): a sliding-window layer keeps every
    slot and its window is a mask."""

    ring = None
    # A decode step's keys padded to a bucket for oneDNN, as in a KVCache: the method reads only
    # keys, values, length, ring and in_ring, which this cache has too (kv_cache.py says why).
    bucketed = KVCache.bucketed

    def __init__(self, cfg: ModelConfig, capacity: int, slots: int, dtype: torch.dtype, device, rows: int = 0):
        shape = (capacity, cfg.n_kv_heads, slots, cfg.head_dim)  # (P, n_kv, L, hd)
        self.all_keys = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(cfg.n_layers)]
        self.all_values = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(cfg.n_layers)]
        self.in_ring = [False] * cfg.n_layers
        self.length = 0
        self.use(rows)

    def use(self, rows: int) -> None:
        """Rows 0..rows-1 are in use: attention sees views of them (no copy)."""
        self.rows = rows
        self.keys = [k[:rows] for k in self.all_keys]  # (b, n_kv, L, hd) each
        self.values = [v[:rows] for v in self.all_values]

    @property
    def capacity(self) -> int:
        return self.all_keys[0].shape[0]

    @property
    def max_len(self) -> int:
        return self.all_keys[0].shape[2]

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Store k, v (b, n_kv, t, hd) at [length, length + t); return slots [0, length + t)."""
        start, end = self.length, self.length + k.shape[2]
        if end > self.max_len:
            raise ValueError(f"batched KV cache is full: {end} slots requested, room for {self.max_len}")
        self.keys[layer][:, :, start:end] = k
        self.values[layer][:, :, start:end] = v
        return self.keys[layer][:, :, :end], self.values[layer][:, :, :end]

    def key_slots(self) -> None:
        return None

    def advance(self, t: int) -> None:
        self.length += t

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.all_keys + self.all_values)


@dataclass(eq=False)
class Row:
    """One sequence: `ids` (1, n) its prompt, `length` the tokens in the cache; `solo` its own cache
    while its prompt is prefilled, `index` its row in the batch once it has joined."""

    ids: torch.Tensor
    length: int = 0
    solo: BatchKVCache | None = None
    index: int | None = None

    @property
    def prompt_tokens(self) -> int:
        return self.ids.shape[1]


class EagerBatchEngine:
    """The eager Decoder with a BatchKVCache: sequences join and leave between decode steps.
    `place(row, src, i, end) -> bool`, when given, is asked first where each prefilled row goes: True
    when it took the row's keys and values (slots [end - n, end) of row i of `src`) elsewhere."""

    FIRST = 256  # cache slots allocated before the first growth, as EagerEngine

    def __init__(self, model, rows: int = 4, chunk: int = 256,
                 place: Callable[[Row, BatchKVCache, int, int], bool] | None = None, kv_dtype: torch.dtype | None = None,
                 c_step=None):
        if rows <= 0 or chunk <= 0:
            raise ValueError(f"rows and chunk must be positive integers, got {rows!r}, {chunk!r}")
        self.model, self.cfg, self.chunk, self.start_rows = model, model.cfg, chunk, rows
        self.place = place
        # fast.decode_step.DecodeStep over `model` (the plan's c_step), or None: the rows' steps go
        # through every layer in one C call, as `generate`'s do, each matrix read once for all rows
        # and each row attending to its own slots (no padding read); else torch's batched step
        self.c_step = c_step
        self.kv_dtype = kv_dtype or model.embed.weight.dtype  # the caches' dtype (the plan's)
        rotary = model.rotary
        # Length-dependent RoPE would turn every row at the longest row's frequencies: one at a time.
        self.max_rows = 1 if rotary is not None and rotary.follows_length else None
        if self.max_rows == 1:
            self.chunk = max(chunk, self.cfg.max_seq_len)
        self.cache: BatchKVCache | None = None
        self.rows: list[Row] = []  # the sequences decoding, in row order

    @property
    def device(self) -> torch.device:
        return self.model.embed.weight.device

    @property
    def dtype(self) -> torch.dtype:
        """The caches' dtype."""
        return self.kv_dtype

    def describe(self) -> str:
        return "the eager engine"

    def add(self, prompt_ids: Sequence[int], max_new_tokens: int) -> Row:
        """A new sequence, to be prefilled (`prefill`) before it joins the batch."""
        check_request(self.model, len(prompt_ids), max_new_tokens)
        ids = torch.tensor([list(prompt_ids)], dtype=torch.long, device=self.device)  # (1, n)
        return Row(ids)

    @torch.no_grad()
    def prefill(self, row: Row) -> torch.Tensor | None:
        """The next `chunk` tokens of the row's prompt into its own cache; after the last chunk the
        row joins the batch and its last token's logits (1, V) are returned, else None."""
        n, a = row.prompt_tokens, row.length
        if row.solo is None:  # its own cache, made at its first chunk (a prompt prefilled in a group needs none)
            row.solo = BatchKVCache(self.cfg, 1, n, self.dtype, self.device, rows=1)
        b = min(n, a + self.chunk)
        if n - b < self.chunk // 2:  # no short tail: it would run other kernels than the whole (fast.quant's
            b = n                    # prefill_rows) and cost a step of its own
        if b < n:  # a middle chunk needs no logits: skip the final norm and the head
            self.model.hidden(row.ids[:, a:b], cache=row.solo)
            row.length = b
            return None
        logits = self.model(row.ids[:, a:b], cache=row.solo, last_only=True)[:, -1]  # (1, V)
        row.length = n
        self._join(row, row.solo, 0, n)
        return logits

    def prefill_next(self, waiting: Sequence[Row]) -> list[tuple[Row, torch.Tensor]]:
        """One prefill forward for the waiting rows, oldest first: the leading prompts that have not
        started and fit in `chunk` tokens together (each padded to the longest) as one batch, else
        the oldest row's next chunk. Returns the rows that joined, each with its logits (1, V)."""
        group = self._group(waiting)
        if len(group) > 1:
            return self._prefill_together(group)
        logits = self.prefill(waiting[0])
        return [] if logits is None else [(waiting[0], logits)]

    def _group(self, waiting: Sequence[Row]) -> list[Row]:
        group: list[Row] = []
        if self.max_rows is not None:  # one sequence at a time: nothing to group
            return group
        for row in waiting:
            width = max([r.prompt_tokens for r in group] + [row.prompt_tokens])
            if row.length or (len(group) + 1) * width > self.chunk:
                break
            group.append(row)
        return group

    @torch.no_grad()
    def _prefill_together(self, group: list[Row]) -> list[tuple[Row, torch.Tensor]]:
        k, width = len(group), max(r.prompt_tokens for r in group)
        ids = torch.zeros(k, width, dtype=torch.long, device=self.device)  # (k, width), left-padded
        real = torch.zeros(k, width, dtype=torch.bool, device=self.device)
        for i, r in enumerate(group):
            ids[i, width - r.prompt_tokens:] = r.ids[0]
            real[i, width - r.prompt_tokens:] = True
        positions = (real.cumsum(1) - 1).clamp(min=0)  # (k, width): 0 at each row's first real token
        cache = BatchKVCache(self.cfg, k, width, self.dtype, self.device, rows=k)
        logits = self.model(ids, position_ids=positions, cache=cache, pad_mask=real, last_only=True)[:, -1]  # (k, V)
        for i, r in enumerate(group):
            r.length = r.prompt_tokens
            self._join(r, cache, i, width)
        return [(r, logits[i:i + 1]) for i, r in enumerate(group)]

    @torch.no_grad()
    def step(self, tokens: torch.Tensor) -> torch.Tensor:
        """tokens (b,), one per row in `rows` order -> logits (b, V) of the next token of each row."""
        if tokens.shape != (len(self.rows),):
            raise ValueError(f"step takes one token per row: {len(self.rows)}, got shape {tuple(tokens.shape)}")
        self._room()
        front = self.cache.length
        lens = torch.tensor([r.length for r in self.rows], device=self.device)  # (b,)
        if self.c_step is not None:
            logits = self.c_step.step(tokens[:, None], self.cache, lens)  # rows 0..b-1 of the batch's buffers
        else:
            pad = None
            if bool((lens != front).any()):  # some row is shorter than the frontier: hide its padding
                pad = torch.arange(front + 1, device=self.device)[None, :] >= (front - lens)[:, None]  # (b, front + 1)
            logits = self.model(tokens[:, None], position_ids=lens[:, None], cache=self.cache, pad_mask=pad)[:, -1]
        for r in self.rows:
            r.length += 1
        return logits  # (b, V)

    def remove(self, row: Row) -> None:
        """The row leaves (finished or cancelled): its slots are free for the next step."""
        row.solo = None
        if row.index is None:
            return
        i, last = row.index, self.rows[-1]
        if last is not row:  # the last row moves into the gap: rows in use stay 0..b-1
            for bufs in (self.cache.all_keys, self.cache.all_values):
                for buf in bufs:
                    buf[i, :, :self.cache.length] = buf[last.index, :, :self.cache.length]
            last.index = i
            self.rows[i] = last
        self.rows.pop()
        row.index = None
        self.cache.use(len(self.rows))
        if not self.rows:
            self.cache = None  # idle: hold no cache (nor may the C step)
            if self.c_step is not None:
                self.c_step.release()
            return
        waste = self._waste()
        if waste >= max(64, self.cache.length // 2):  # a long row left: stop reading its padding
            self._relayout(-waste, self.cache.max_len, self.cache.capacity)

    # -- layout -------------------------------------------------------------------------------
    def _waste(self) -> int:
        """Slots at the left that are padding in every row."""
        return self.cache.length - max(r.length for r in self.rows)

    def _join(self, row: Row, src: BatchKVCache, i: int, end: int) -> None:
        """The row's prefilled keys and values, slots [end - n, end) of row i of `src`, into the next
        free row of the batch, ending at the frontier (or where `place` puts it)."""
        if self.place is not None and self.place(row, src, i, end):
            return
        if self.max_rows is not None and len(self.rows) >= self.max_rows:
            raise ValueError(f"this model's RoPE follows the sequence length (Rotary.follows_length): it decodes "
                             f"{self.max_rows} sequence at a time")
        n = row.length
        if self.cache is None:  # the first row: its tokens end at the frontier already
            self.cache = BatchKVCache(self.cfg, self.start_rows, max(min(self.FIRST, self.cfg.max_seq_len), n + 1),
                                      self.dtype, self.device)
            self.cache.length = n
        shift = max(0, n - self.cache.length)  # the frontier must reach the new row's first slot
        rows = len(self.rows) + 1
        if shift or n + 1 > self.cache.max_len or rows > self.cache.capacity:
            slots = max(self.cache.max_len, self._grown(self.cache.length + shift + 1))
            self._relayout(shift, slots, max(rows, self.cache.capacity * (2 if rows > self.cache.capacity else 1)))
        front, at = self.cache.length, len(self.rows)
        for dst, held in ((self.cache.all_keys, src.all_keys), (self.cache.all_values, src.all_values)):
            for d, s in zip(dst, held, strict=True):
                d[at, :, front - n: front] = s[i, :, end - n: end]
        row.solo, row.index = None, at
        self.rows.append(row)
        self.cache.use(len(self.rows))

    def _grown(self, need: int) -> int:
        """Slots for `need`: doubling, up to the context."""
        size = self.cache.max_len
        while size < need:
            size *= 2
        return max(need, min(size, self.cfg.max_seq_len))

    def _room(self) -> None:
        """A free slot at the frontier for the next step: drop shared padding, else grow."""
        if self.cache.length + 1 <= self.cache.max_len:
            return
        waste = self._waste()
        need = self.cache.length - waste + 1
        # Compacting alone would leave the buffers nearly full (a copy at every step): grow as well.
        slots = self.cache.max_len if need <= self.cache.max_len * 3 // 4 else self._grown(2 * need)
        self._relayout(-waste, max(slots, need), self.cache.capacity)

    def _relayout(self, shift: int, slots: int, capacity: int) -> None:
        """New buffers of `capacity` rows and `slots` slots, the rows in use copied with their slots
        moved by `shift` (> 0 right, < 0 left: the |shift| leftmost slots, padding, are dropped)."""
        old = self.cache
        new = BatchKVCache(self.cfg, capacity, slots, self.dtype, self.device, rows=old.rows)
        keep = max(0, -shift)
        for dst, src in ((new.all_keys, old.all_keys), (new.all_values, old.all_values)):
            for d, s in zip(dst, src, strict=True):
                d[:old.rows, :, keep + shift: old.length + shift] = s[:old.rows, :, keep: old.length]
        new.length = old.length + shift
        self.cache = new

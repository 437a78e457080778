"""One model served to many clients at once: continuous batching behind a bounded queue.

Up to `parallel` requests run together on one thread: each loop runs one prefill forward (the
prompts that arrived together, padded into one batch, or one chunk of the oldest long prompt),
then decodes one token for every other running request in one batch (a batch engine,
llamablock.runtime.engine.BatchEngine), so a long prompt holds the others' streams for one chunk at
a time, not for its whole prefill; `parallel` 1 runs the same loop with one row. Between two
loops, requests that finished or whose client left give up their rows, and waiting ones take the
free rows. The rest wait in a queue of at most `max_queue` (a full queue is refused at once,
Busy, which the API answers 503 with Retry-After, rather than left to grow). This is the scheme
of Orca (Yu et al., OSDI 2022) that llama.cpp's server (`-np`), vLLM and Ollama
(OLLAMA_NUM_PARALLEL) follow.

Each request is a llamablock.runtime.request.Request, as in `generate`: its sampling settings, its
own torch.Generator when seeded (so a seeded request draws the same numbers alone or among
others), its stop strings and end-of-sequence ids, max_tokens, its token history (the repetition
penalty) and its text stream; its `take` chooses every token and says when it stops, so a request
stops here as it stops in `generate`. Generation runs on the scheduler's thread, never on the
server's event loop; each piece of text goes to the event loop that asked for it
(`loop.call_soon_threadsafe`), as events: ("text", str), then ("done", Generation) or ("error",
Exception). A client that disconnects sets its job's `cancelled`: a waiting job is skipped, a
running one leaves the batch before the next step.

A compiled engine built for a batch of B (AOTIEngine(batch=B); B = 1 for `parallel` 1) decodes the
batch's rows (llamablock.fast.compiled.batch_compiled.CompiledBatchEngine), the rows it cannot hold
eagerly beside them.
Counters for /metrics: llamablock.web.metrics; one log line per request (logger llamablock.serve).
"""

from __future__ import annotations

import contextlib
import itertools
import queue
import threading
import time

import torch

from llamablock.runtime.batch import EagerBatchEngine
from llamablock.runtime.engine import BatchEngine
from llamablock.runtime.request import Request
from llamablock.web.jobs import Busy, Cancelled, Job, Running
from llamablock.web.metrics import ServerMetrics

__all__ = ["Busy", "Cancelled", "GATHER_S", "Job", "Scheduler"]

GATHER_S = 0.05  # the longest a prefill waits for requests still being read and tokenized (Scheduler._gather)


class Scheduler:
    """Runs jobs, up to `parallel` at once, on a background thread, on one batch engine: with
    `compiled`, an engine prepared before serving, a CompiledBatchEngine whose step is its program
    (the requests it does not cover run on the eager model beside it); else `engine_factory(model,
    rows=, chunk=)` (EagerBatchEngine). `chunk` is the most prompt tokens prefilled between two
    decode steps."""

    def __init__(self, model, tokenizer, max_queue: int = 8, compiled=None, *, parallel: int = 4,
                 chunk: int = 256, engine_factory=EagerBatchEngine):
        if max_queue <= 0:
            raise ValueError(f"max_queue must be a positive integer, got {max_queue!r}")
        self.model, self.tokenizer, self.compiled = model, tokenizer, compiled
        self.engine: BatchEngine
        if compiled is not None:
            from llamablock.fast.compiled.batch_compiled import CompiledBatchEngine

            self.engine = CompiledBatchEngine(model, compiled, chunk=chunk)
        else:
            self.engine = engine_factory(model, rows=parallel, chunk=chunk)
        self.parallel = parallel
        self.jobs: queue.Queue = queue.Queue(maxsize=max_queue)
        self.active: list[Running] = []  # admitted, in arrival order (read by other threads: replaced, not mutated)
        self.metrics = ServerMetrics(running=lambda: len(self.active), queued=self.jobs.qsize)
        self._ids = itertools.count(1)
        self._preparing = 0  # requests the API is reading, templating and tokenizing (`preparing`)
        self._preparing_lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="llamablock-scheduler", daemon=True)
        self._thread.start()

    @property
    def parallel(self) -> int:
        return self._parallel

    @parallel.setter
    def parallel(self, n: int) -> None:
        """How many requests run at once; may change while serving (taken at the next admission)."""
        if not isinstance(n, int) or n <= 0:
            raise ValueError(f"parallel must be a positive integer, got {n!r}")
        self._parallel = n

    @property
    def capacity(self) -> int:
        """Requests that run at once: `parallel`, or fewer where the engine allows fewer rows."""
        return min(self.parallel, self.engine.max_rows or self.parallel)

    @property
    def running(self) -> list[Job]:
        """The jobs running now (admitted, not finished)."""
        return [r.job for r in self.active]

    def describe(self) -> str:
        """One line for the start-up: how requests run."""
        if self.capacity == 1 and self.engine.max_rows == 1:
            how = "one request at a time (this model's RoPE follows the sequence length, so rows cannot share a batch)"
        elif self.parallel == 1:
            how = f"one request at a time on {self.engine.describe()}"
        else:
            how = f"up to {self.parallel} requests decoded together as one batch on {self.engine.describe()}"
        return f"{how}; {self.jobs.maxsize} more may wait"

    @contextlib.contextmanager
    def preparing(self):
        """Around the API's work on a request before `submit`: a prefill about to start waits for it
        (at most GATHER_S), so that prompts sent together are prefilled together."""
        with self._preparing_lock:
            self._preparing += 1
        try:
            yield
        finally:
            with self._preparing_lock:
                self._preparing -= 1

    def submit(self, job: Job) -> Job:
        job.id = next(self._ids)
        job.arrived = time.monotonic()
        try:
            self.jobs.put_nowait(job)
        except queue.Full:
            raise Busy(f"{self.jobs.maxsize} requests are already waiting; try again shortly") from None
        return job

    def close(self) -> None:
        """Stop after the current step (running and waiting jobs are dropped)."""
        for job in self.running:
            job.cancelled.set()
        while True:
            try:
                self.jobs.get_nowait().cancelled.set()
            except queue.Empty:
                break
        self.jobs.put(None)
        self._thread.join(timeout=30)

    # -- the loop -----------------------------------------------------------------------------
    def _run(self) -> None:
        while True:
            if not self._admit() or (self._gather() and not self._admit()):
                return
            self._leave_cancelled()
            try:
                self._prefill()
                self._decode()
            except Exception as e:  # a step failed for the whole batch: report it to each, go on
                for r in list(self.active):
                    self._finish(r, None, e)

    def _admit(self) -> bool:
        """Move waiting jobs into free rows; block while nothing runs. False when closing."""
        while len(self.active) < self.capacity:
            try:
                job = self.jobs.get(block=not self.active)
            except queue.Empty:
                return True
            if job is None:
                return False
            if job.cancelled.is_set():
                self._count(job, "cancelled", 0, time.monotonic())
                continue  # its client left while it waited
            try:
                row = self.engine.add(job.prompt_ids, job.max_tokens)
                request = Request(job.prompt_ids, job.max_tokens, job.sampling, seed=job.seed,
                                  eos_ids=self.tokenizer.eos_ids, stop_strings=job.stop, tokenizer=self.tokenizer,
                                  on_text=lambda s, job=job: job.emit("text", s), device=self.engine.device)
            except Exception as e:
                self._count(job, "error", 0, time.monotonic())
                job.emit("error", e)
                continue
            self.active = self.active + [Running(job, row, request, started=time.monotonic())]
        return True

    def _gather(self) -> bool:
        """Before a new prompt's prefill, while the API is still preparing other requests and rows
        are free: wait for them, at most GATHER_S. Four clients that send at once reach the queue a
        few milliseconds apart (more while this thread's Python holds the interpreter lock), and
        without the wait the first prompt is prefilled alone and the others after it (`llamablock
        bench serve`'s first-token times). True when it waited (the caller admits again)."""
        fresh = any(r.row.index is None and r.row.length == 0 for r in self.active)
        if not fresh or not self._preparing or len(self.active) >= self.capacity:
            return False
        end = time.monotonic() + GATHER_S
        while self._preparing and time.monotonic() < end:
            time.sleep(0.002)
        return True

    def _leave_cancelled(self) -> None:
        for r in [r for r in self.active if r.job.cancelled.is_set()]:
            self._count(r.job, "cancelled", len(r.request.new), time.monotonic(), r)  # counted before it leaves: a
            self._drop(r)  # reader who sees it gone sees it counted

    def _prefill(self) -> None:
        """One prefill forward (the engine's prefill_next): the prompts that arrived together, or one
        chunk of the oldest; the first token of each request that joined the batch."""
        waiting = [r for r in self.active if r.row.index is None]
        if not waiting:
            return
        try:
            joined = self.engine.prefill_next([r.row for r in waiting])  # [(row, logits (1, V))]
        except Exception as e:  # the oldest request's failure (its cache could not be allocated, ...):
            self._finish(waiting[0], None, e)  # it leaves; the others try again at the next loop
            return
        by_row = {id(r.row): r for r in waiting}
        for row, logits in joined:
            self.metrics.prompt_tokens.inc(row.prompt_tokens)
            self._take(by_row[id(row)], logits)

    def _decode(self) -> None:
        """One token for every row in the batch."""
        rows = list(self.engine.rows)
        if not rows:
            return
        by_row = {id(r.row): r for r in self.active}
        running = [by_row[id(row)] for row in rows]
        tokens = torch.tensor([r.request.new[-1] for r in running], device=self.engine.device)  # (b,)
        logits = self.engine.step(tokens)  # (b, V)
        for i, r in enumerate(running):
            self._take(r, logits[i:i + 1])

    def _take(self, r: Running, logits: torch.Tensor) -> None:
        """The request's next token from logits (1, V) (Request.take: it streams the text and says
        whether the request stops), counted."""
        stop = r.request.take(logits).stop
        now = time.monotonic()
        self.metrics.generated_tokens.inc()
        if len(r.request.new) == 1:
            r.first = now
            self.metrics.ttft.observe(now - r.job.arrived)
        else:
            self.metrics.token_latency.observe(now - r.last)
        r.last = now
        if stop is not None:
            self._finish(r, stop)

    def _finish(self, r: Running, reason: str | None, error: Exception | None = None) -> None:
        """The request leaves: counted, its row freed, then its client told (in that order, so that
        whoever has its answer finds it counted and its row free)."""
        now = time.monotonic()
        new = len(r.request.new)
        self._count(r.job, "error" if error is not None else reason, new, now, r)
        self._drop(r)
        if error is not None:
            r.job.emit("error", error)
            return
        first = r.first or now
        r.job.emit("done", r.request.result(first - r.started, now - first, max(0, new - 1)))

    def _drop(self, r: Running) -> None:
        self.engine.remove(r.row)
        self.active = [a for a in self.active if a is not r]

    # -- accounts -----------------------------------------------------------------------------
    def _count(self, job: Job, outcome: str, tokens: int, now: float, r: Running | None = None) -> None:
        started, first = (r.started, r.first) if r is not None else (None, None)
        self.metrics.finished(job.id, outcome, len(job.prompt_ids), tokens, job.arrived, started, first or None, now)

"""One model served to many clients: a bounded queue of requests and one worker thread.

Generation runs on the worker thread, never on the server's event loop nor in its pool of request
threads, so the page's figure endpoints keep answering while a long generation runs. Requests
wait their turn in a queue of at most `max_queue` (a full queue is refused at once, 503, rather
than left to grow); the running one and the waiting ones are all cancellable: a client that
disconnects sets its job's `cancelled`, the worker skips a waiting job and stops a running one
before its next decode step (`_Cancellable` wraps the engine), and takes the next.

The worker hands each piece of text to the event loop that asked for it
(`loop.call_soon_threadsafe`), where the request reads them from an asyncio queue as events:
("text", str), then ("done", Generation) or ("error", Exception).

`ServedModel` is what the API serves (a name, the model, its tokenizer, its worker) and
`load_served` builds one from a `--model` argument.

Engines: a request runs on the compiled engine (llamablock.fast.compiled_decode.AOTIEngine) when
one is given and already covers the request's length (its programs loaded or compiled before
serving began: nothing is compiled inside a request), and on the eager engine otherwise.
"""

from __future__ import annotations

import asyncio
import itertools
import queue
import threading
import time
from dataclasses import dataclass, field

from llamablock.runtime.engine import EagerEngine
from llamablock.runtime.generate import generate
from llamablock.runtime.sampling import Sampling


class Cancelled(Exception):
    """The client went away: the job stops before its next step."""


class Busy(Exception):
    """The queue is full."""


@dataclass
class Job:
    prompt_ids: list[int]
    max_tokens: int
    sampling: Sampling
    seed: int | None
    stop: list[str]
    loop: asyncio.AbstractEventLoop
    events: asyncio.Queue = field(default_factory=asyncio.Queue)
    cancelled: threading.Event = field(default_factory=threading.Event)
    id: int = 0

    def emit(self, kind: str, value) -> None:
        """From the worker thread: hand one event to the request's event loop."""
        try:
            self.loop.call_soon_threadsafe(self.events.put_nowait, (kind, value))
        except RuntimeError:  # the loop is closed: the server is stopping
            self.cancelled.set()


class _Cancellable:
    """An engine that raises `Cancelled` before any step once its job is cancelled."""

    def __init__(self, engine, cancelled: threading.Event):
        self.engine, self.cancelled, self.cfg = engine, cancelled, engine.cfg

    def prepare(self, total_tokens: int) -> None:
        self.engine.prepare(total_tokens)

    def prefill(self, ids):
        if self.cancelled.is_set():
            raise Cancelled
        return self.engine.prefill(ids)

    def step(self, ids, pos: int):
        if self.cancelled.is_set():
            raise Cancelled
        return self.engine.step(ids, pos)


class GenerationWorker:
    """Runs jobs one at a time on a background thread. `engine_factory(model) -> engine` makes the
    eager engine of each request (EagerEngine by default); `compiled` is an engine built and
    loaded before serving, used when it covers a request."""

    def __init__(self, model, tokenizer, max_queue: int = 8, compiled=None, engine_factory=EagerEngine):
        if max_queue <= 0:
            raise ValueError(f"max_queue must be a positive integer, got {max_queue!r}")
        self.model, self.tokenizer, self.compiled, self.engine_factory = model, tokenizer, compiled, engine_factory
        self.jobs: queue.Queue = queue.Queue(maxsize=max_queue)
        self.current: Job | None = None  # the job running now (tests and status read it)
        self._ids = itertools.count(1)
        self._thread = threading.Thread(target=self._run, name="llamablock-generation", daemon=True)
        self._thread.start()

    def submit(self, job: Job) -> Job:
        job.id = next(self._ids)
        try:
            self.jobs.put_nowait(job)
        except queue.Full:
            raise Busy(f"{self.jobs.maxsize} requests are already waiting; try again shortly") from None
        return job

    def close(self) -> None:
        """Stop the worker after the running job (waiting ones are dropped)."""
        if self.current is not None:
            self.current.cancelled.set()
        while True:
            try:
                self.jobs.get_nowait().cancelled.set()
            except queue.Empty:
                break
        self.jobs.put(None)
        self._thread.join(timeout=30)

    def _engine(self, total: int, cancelled: threading.Event):
        if self.compiled is not None and self.compiled.covers(total):
            return _Cancellable(self.compiled, cancelled)
        return _Cancellable(self.engine_factory(self.model), cancelled)

    def _run(self) -> None:
        while True:
            job = self.jobs.get()
            if job is None:
                return
            if job.cancelled.is_set():
                continue  # its client left while it waited
            self.current = job
            try:
                g = generate(self._engine(len(job.prompt_ids) + job.max_tokens, job.cancelled), job.prompt_ids,
                             job.max_tokens, job.sampling, seed=job.seed, eos_ids=self.tokenizer.eos_ids,
                             stop_strings=job.stop, tokenizer=self.tokenizer,
                             on_text=lambda s, job=job: job.emit("text", s))
                job.emit("done", g)
            except Cancelled:
                pass
            except Exception as e:  # reported to the client, the worker goes on
                job.emit("error", e)
            finally:
                self.current = None


@dataclass
class ServedModel:
    """The model behind /v1: its id, the Decoder, its tokenizer and the worker that runs it.
    `aliases`: other names a request may give for it (the path it was loaded from)."""

    name: str
    model: object
    tokenizer: object
    worker: GenerationWorker
    created: int = 0
    aliases: tuple[str, ...] = ()


def load_served(model: str | None = None, max_queue: int = 8, compile_tokens: int | None = None,
                device: str = "cpu") -> ServedModel:
    """Load a model (a name or path as `llamablock generate --model` takes, or a run directory) and
    start its worker, the file read once (fast/plan.py). Requests run on the eager engine, in the
    file's own precision; the compiled engine serves the requests it covers when `llamablock compile`
    has built it for this model (fast/builds.py), or when `compile_tokens` asks for it: then it is
    prepared now for requests up to that many tokens, loaded from the compile cache or compiled
    once, so that no request waits for a compilation. With a compiled engine the eager model is
    made from the same weights (plan.eager_beside)."""
    from llamablock.fast.plan import build, decide, eager_beside, prepare
    from llamablock.io.source import open_source

    if compile_tokens and device != "cpu":
        raise ValueError(f"the compiled engine runs on the CPU; serve with --device cpu to use --compile-tokens, not {device}")
    source = open_source(model)
    plan = decide(source, "auto", "compiled" if compile_tokens else "auto", device)
    built = build(source, plan)
    compiled = None
    if plan.engine == "compiled":
        compiled, m = built.engine, eager_beside(built)
        prepare(compiled, source, min(compile_tokens or plan.built, source.cfg.max_seq_len))
    else:
        m = built.model
    arg = model or source.name
    return ServedModel(source.name, m, source.tokenizer, GenerationWorker(m, source.tokenizer, max_queue, compiled),
                       int(time.time()), (arg,))

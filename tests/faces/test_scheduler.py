"""The continuous-batching scheduler (llamablock.web.scheduler), driven step by step.

Its engine is the batched eager engine with a turnstile: each decode step waits for a permit
the test hands out, and records how many rows it decoded, so the tests say exactly which step a
request joins or leaves at, and nothing depends on timing. A tiny random Llama in float32,
written as GGUF with a byte-level vocabulary; the reference for every answer is `generate`, the
same request alone.
"""

from __future__ import annotations

import asyncio
import logging
import threading

import pytest
from event_loop import loop_thread
from gguf_tiny import write_tiny_gguf
from hf_reference import tiny_hf_model
from prometheus_client.parser import text_string_to_metric_families

from llamablock.io.loading import load_model_and_tokenizer
from llamablock.runtime.batch import EagerBatchEngine
from llamablock.runtime.engine import EagerEngine
from llamablock.runtime.generate import generate
from llamablock.runtime.sampling import Sampling
from llamablock.web.scheduler import Busy, Job, Scheduler

WAIT = 30  # seconds any wait may take before the test fails (a hang guard, never a measurement)


class Turnstile(EagerBatchEngine):
    """A decode step takes one permit (`let(n)` gives n) and records its number of rows;
    `arrived` counts the steps begun, so arrived == len(batch_sizes) + 1 means the scheduler waits
    at a step whose rows are fixed."""

    def __init__(self, model, **kw):
        super().__init__(model, **kw)
        self.permits = threading.Semaphore(0)
        self.batch_sizes: list[int] = []
        self.arrived = 0
        self.chunks: dict[int, int] = {}  # prefill calls, by prompt length

    def prefill(self, row):
        self.chunks[row.prompt_tokens] = self.chunks.get(row.prompt_tokens, 0) + 1
        return super().prefill(row)

    def let(self, n: int = 1) -> None:
        for _ in range(n):
            self.permits.release()

    def step(self, tokens):
        self.arrived += 1
        assert self.permits.acquire(timeout=WAIT), "no permit came"
        self.batch_sizes.append(len(self.rows))
        return super().step(tokens)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    f = tmp_path_factory.mktemp("sched") / "tiny.gguf"
    write_tiny_gguf(f, tiny_hf_model("llama", n_heads=4, n_kv=2, max_position_embeddings=128))
    return load_model_and_tokenizer(f)


@pytest.fixture
def loop():
    """An event loop on its own thread: the jobs' events arrive there, as in the server."""
    with loop_thread(WAIT) as lp:
        yield lp


@pytest.fixture
def sched(tiny):
    model, tok = tiny
    s = Scheduler(model, tok, max_queue=2, parallel=2, chunk=8, engine_factory=Turnstile)
    yield s
    s.engine.let(1000)
    s.close()


def job(loop, tok, text: str, n: int, temperature=0.0, seed=None, stop=()) -> Job:
    return Job(tok.encode(text), n, Sampling(temperature), seed, list(stop), loop)


def events(loop, j: Job, until: str = "done") -> list:
    """The job's events up to and including the first of kind `until` (or an error)."""
    out = []
    while not out or out[-1][0] not in (until, "error"):
        out.append(asyncio.run_coroutine_threadsafe(asyncio.wait_for(j.events.get(), WAIT), loop).result())
    return out


def reference(tiny, text: str, n: int, temperature=0.0, seed=None, stop=()):
    model, tok = tiny
    return generate(EagerEngine(model), tok.encode(text), n, Sampling(temperature), seed=seed, eos_ids=tok.eos_ids,
                    stop_strings=list(stop), tokenizer=tok)


def until(condition, what: str):
    import time
    end = time.monotonic() + WAIT
    while not condition():
        assert time.monotonic() < end, f"gave up waiting for {what}"
        time.sleep(0.005)


def test_a_request_joins_between_steps_and_both_answers_are_their_own(tiny, sched, loop):
    tok, eng = tiny[1], sched.engine
    a = sched.submit(job(loop, tok, "ROMEO: but soft", 12))
    eng.let(3)
    until(lambda: eng.arrived == 4, "three steps of the first request, the fourth waiting")
    b = sched.submit(job(loop, tok, "JULIET: O Romeo, Romeo, wherefore", 6))  # 33 tokens: 5 chunks of 8
    eng.let(100)
    ga, gb = events(loop, a)[-1][1], events(loop, b)[-1][1]
    assert ga.tokens == reference(tiny, "ROMEO: but soft", 12).tokens
    assert gb.tokens == reference(tiny, "JULIET: O Romeo, Romeo, wherefore", 6).tokens
    # alone for 3 steps, then alone while b's prompt is prefilled a chunk per step, then together
    sizes = eng.batch_sizes
    b_chunks = eng.chunks[len(b.prompt_ids)]  # its prompt is the longer one: several chunks of 8
    assert b_chunks >= 3 and sizes[:4] == [1, 1, 1, 1] and sizes.index(2) == 3 + b_chunks


def test_requests_sent_together_are_prefilled_in_one_forward(tiny, loop, monkeypatch):
    """A request arrives while the API is still preparing another (`preparing`): its prefill waits
    for it (at most GATHER_S, here long enough that a slow machine cannot make the test pass or fail
    by timing), and the two prompts join the batch after one forward. Without the wait the first is
    prefilled alone."""
    from llamablock.web import scheduler

    monkeypatch.setattr(scheduler, "GATHER_S", WAIT)
    model, tok = tiny
    groups = []

    class Recording(EagerBatchEngine):
        def prefill_next(self, waiting):
            joined = super().prefill_next(waiting)
            groups.append(len(joined))
            return joined

    s = Scheduler(model, tok, max_queue=4, parallel=4, engine_factory=Recording)
    try:
        with s.preparing():  # the second request is still being read when the first is submitted
            a = s.submit(job(loop, tok, "ROMEO: but soft", 4))
            until(lambda: s.running, "the first request taking a row")
            b = s.submit(job(loop, tok, "JULIET: O Romeo", 4))
        ga, gb = events(loop, a)[-1][1], events(loop, b)[-1][1]
    finally:
        s.close()
    assert groups[0] == 2, groups
    assert ga.tokens == reference(tiny, "ROMEO: but soft", 4).tokens
    assert gb.tokens == reference(tiny, "JULIET: O Romeo", 4).tokens


def test_requests_that_end_leave_while_another_goes_on(tiny, sched, loop):
    """One ends at max_tokens, one at a stop string; two are sampled with seeds, and draw what they
    would alone."""
    tok, eng = tiny[1], sched.engine
    want = reference(tiny, "KING: now", 9, temperature=1.0, seed=4)
    stop = next(want.text[i:i + 2] for i in range(2, len(want.text) - 2) if want.text[i:i + 2] not in want.text[:i + 1])
    short = sched.submit(job(loop, tok, "To be", 3))
    stopped = sched.submit(job(loop, tok, "KING: now", 9, temperature=1.0, seed=4, stop=[stop]))
    eng.let(1)
    until(lambda: len(eng.batch_sizes) == 1, "the first step")
    longer = sched.submit(job(loop, tok, "Friends, Romans", 20, temperature=0.8, seed=11))  # its own generator
    eng.let(100)
    g_short, g_stop, g_long = (events(loop, j)[-1][1] for j in (short, stopped, longer))
    assert (g_short.tokens, g_short.stop_reason) == (reference(tiny, "To be", 3).tokens, "length")
    assert g_stop.stop_reason == "stop_string" and g_stop.text == want.text[: want.text.index(stop)]
    assert g_long.tokens == reference(tiny, "Friends, Romans", 20, temperature=0.8, seed=11).tokens
    sizes = eng.batch_sizes
    assert max(sizes) == 2 and sizes[-1] == 1  # the others left; the longest finished alone


def test_a_cancelled_request_frees_its_row_at_the_next_step(tiny, sched, loop):
    tok, eng = tiny[1], sched.engine
    a = sched.submit(job(loop, tok, "ROMEO:", 30))
    b = sched.submit(job(loop, tok, "JULIET:", 30))
    eng.let(2)
    until(lambda: eng.arrived == 3 and eng.batch_sizes[-1] == 2, "two steps done together, the third waiting")
    b.cancelled.set()  # the step already waiting for its permit decodes both rows; the next, a's only
    eng.let(2)
    until(lambda: len(eng.batch_sizes) == 4, "the next steps")
    assert eng.batch_sizes[2:] == [2, 1] and sched.running == [a]
    eng.let(100)
    assert events(loop, a)[-1][1].tokens == reference(tiny, "ROMEO:", 30).tokens
    assert all(kind == "text" for kind, _ in _pending(loop, b))  # no answer for a client that left


def _pending(loop, j: Job) -> list:
    out = []
    while not j.events.empty():
        out.append(asyncio.run_coroutine_threadsafe(j.events.get(), loop).result(WAIT))
    return out


def test_a_full_queue_is_refused(tiny, sched, loop):
    tok, eng = tiny[1], sched.engine
    running = [sched.submit(job(loop, tok, "A", 20)) for _ in range(2)]
    eng.let(1)  # in case the first was admitted alone: the second joins after a step
    until(lambda: len(sched.running) == 2 and eng.batch_sizes, "two running")
    waiting = [sched.submit(job(loop, tok, "B", 2)) for _ in range(2)]  # the queue holds 2
    with pytest.raises(Busy, match="2 requests are already waiting"):
        sched.submit(job(loop, tok, "C", 2))
    eng.let(1000)
    assert all(events(loop, j)[-1][0] == "done" for j in running + waiting)


def test_metrics_count_what_was_served_and_each_request_logs_a_line(tiny, sched, loop, caplog):
    caplog.set_level(logging.INFO, logger="llamablock.serve")
    tok, eng = tiny[1], sched.engine
    eng.let(1000)
    jobs = []
    for p, n in (("A", 4), ("Bee", 7), ("Sea", 5)):
        jobs.append(sched.submit(job(loop, tok, p, n)))
        until(sched.jobs.empty, "its admission")  # the queue holds 2
    done = [events(loop, j)[-1][1] for j in jobs]
    eng.permits = threading.Semaphore(0)  # no row is running: the next request's first step waits
    gone = sched.submit(job(loop, tok, "D", 50))
    until(lambda: sched.running, "the fourth to start")
    gone.cancelled.set()
    eng.let(1)
    until(lambda: not sched.running, "the cancelled one to leave")
    samples = [s for f in text_string_to_metric_families(sched.metrics.text().decode()) for s in f.samples]

    def value(name, **labels):
        return next(s.value for s in samples if s.name == name and s.labels == labels)

    generated = sum(len(g.tokens) for g in done)
    assert value("llamablock_requests_running") == 0 and value("llamablock_requests_queued") == 0
    finished = {r: value("llamablock_requests_total", outcome=r) for r in {g.stop_reason for g in done}}
    assert sum(finished.values()) == 3 and value("llamablock_requests_total", outcome="cancelled") == 1
    assert value("llamablock_generated_tokens_total") >= generated  # plus the cancelled one's
    assert value("llamablock_prompt_tokens_total") == sum(len(j.prompt_ids) for j in jobs + [gone])
    assert value("llamablock_time_to_first_token_seconds_count") == 4
    assert value("llamablock_time_per_output_token_seconds_count") == value("llamablock_generated_tokens_total") - 4
    lines = [r.getMessage() for r in caplog.records if r.name == "llamablock.serve"]
    for j, g in zip(jobs, done, strict=True):
        assert any(f"request {j.id}: {g.stop_reason}, {len(j.prompt_ids)} prompt tokens, {len(g.tokens)} new;" in line
                   and "first token" in line for line in lines), lines
    assert any(line.startswith(f"request {gone.id}: cancelled") for line in lines) and len(lines) == 4


@pytest.mark.parametrize("flags, message", [(["--parallel", "0"], "--parallel must be a positive integer"),
                                            (["--prefill-chunk", "-1"], "--prefill-chunk must be a positive integer"),
                                            (["--compile-tokens", "1"], "at least 2"),
                                            (["--engine", "eager", "--compile-tokens", "64"], "leave out --engine eager")])
def test_serve_refuses_a_bad_batch_flag_in_one_line(capsys, flags, message):
    from llamablock.cli import build_parser, main

    assert build_parser().parse_args(["serve"]).parallel == 4
    assert main(["serve", *flags]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err

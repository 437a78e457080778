"""The three ways a request is served stop alike: `generate` (one sequence on an engine), the
scheduler with one row (`serve --parallel 1`) and the scheduler with several requests in one batch.

Each case is a stop rule: an end-of-sequence id, a stop string that spans two tokens, the length,
and the repetition penalty's history (a penalty that changes the greedy choice). The reference is
independent of all three: the whole sequence run through the model at every step (no cache), the
penalty applied over the prompt and the tokens so far, and the stop rules applied by hand to the
decoded text. Three prompts of different lengths are served on every path (together on the
batched one, in turn on the others); the tokens, the stop reason, the final text and the text
streamed must equal the reference's. A tiny random Llama in float32; the tokenizer decodes id i as
one letter, so a two-letter stop string spans two tokens.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import pytest
import torch
from event_loop import loop_thread
from hf_reference import tiny_hf_model

import llamablock
from llamablock.runtime.batch import EagerBatchEngine
from llamablock.runtime.engine import EagerEngine
from llamablock.runtime.generate import generate
from llamablock.runtime.sampling import Sampling, apply_repetition_penalty
from llamablock.web.scheduler import Job, Scheduler

WAIT = 30  # seconds any wait may take before the test fails (a hang guard, never a measurement)
PROMPTS = [[7, 8], [5, 17, 3, 88, 42, 9, 61], [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12]]
MAIN = 1  # the prompt whose free run sets each case's end-of-sequence id and stop string
PENALTY = 2.0  # changes the main prompt's greedy tokens, and changes them otherwise without the prompt's


class Letters:
    """Decodes id i as the letter chr(ord('a') + i % 26); end-of-sequence ids are special tokens."""

    def __init__(self, eos_ids=()):
        self.eos_ids = list(eos_ids)

    def decode(self, ids, skip_special_tokens=False):
        return "".join(chr(ord("a") + i % 26) for i in ids if not (skip_special_tokens and i in self.eos_ids))


@dataclass
class Case:
    max_tokens: int
    sampling: Sampling
    tok: Letters
    stop: list[str]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    d = tmp_path_factory.mktemp("tiny")
    tiny_hf_model("llama", n_heads=4, n_kv=2).save_pretrained(d)
    return llamablock.load_pretrained(d)


@torch.no_grad()
def greedy(model, prompt: list[int], n: int, penalty: float = 1.0, prompt_penalized: bool = True) -> list[int]:
    """n greedy tokens, the whole sequence through the model at each step, the penalty over all of
    it (over the new tokens only with prompt_penalized False: a wrong history, to show it matters)."""
    seq = list(prompt)
    for _ in range(n):
        logits = model(torch.tensor([seq]))[:, -1].float()  # (1, V)
        history = seq if prompt_penalized else seq[len(prompt):] or seq[-1:]
        seq.append(int(apply_repetition_penalty(logits, torch.tensor([history]), penalty).argmax()))
    return seq[len(prompt):]


def reference(model, prompt: list[int], case: Case) -> tuple[list[int], str, str]:
    """(tokens, stop reason, text): the free run cut by the stop rules, applied by hand."""
    free = greedy(model, prompt, case.max_tokens, case.sampling.repetition_penalty)
    for i, tok in enumerate(free):
        text = case.tok.decode(free[: i + 1], skip_special_tokens=True)
        if tok in case.tok.eos_ids:
            return free[: i + 1], "eos", text
        hits = [text.find(s) for s in case.stop if s in text]
        if hits:
            return free[: i + 1], "stop_string", text[: min(hits)]
    return free, "length", case.tok.decode(free, skip_special_tokens=True)


@pytest.fixture(scope="module")
def cases(tiny) -> dict[str, Case]:
    free = greedy(tiny, PROMPTS[MAIN], 20)
    text = Letters().decode(free)
    k = next(i for i in range(2, len(text) - 2) if text[i:i + 2] not in text[:i + 1])  # first seen at i
    out = {"eos": Case(20, Sampling(), Letters([free[3]]), []),
           "stop string": Case(20, Sampling(), Letters(), [text[k:k + 2]]),
           "length": Case(6, Sampling(), Letters(), []),
           "repetition penalty": Case(12, Sampling(repetition_penalty=PENALTY), Letters(), [])}
    # each case's rule is what stops the main prompt; the penalty changes the greedy choice, and
    # a history without the prompt would give other tokens again
    assert [reference(tiny, PROMPTS[MAIN], c)[1] for c in out.values()] == ["eos", "stop_string", "length", "length"]
    penalized = greedy(tiny, PROMPTS[MAIN], 12, PENALTY)
    assert penalized != free[:12] and penalized != greedy(tiny, PROMPTS[MAIN], 12, PENALTY, prompt_penalized=False)
    return out


@pytest.fixture(scope="module")
def loop():
    """An event loop on its own thread: the jobs' events arrive there, as in the server."""
    with loop_thread(WAIT) as lp:
        yield lp


def by_generate(model, case: Case, loop) -> tuple[list, int]:
    """Each prompt's (Generation, text streamed), and the most rows decoded in one step (one here)."""
    out = []
    for prompt in PROMPTS:
        pieces = []
        g = generate(EagerEngine(model), prompt, case.max_tokens, case.sampling, eos_ids=case.tok.eos_ids,
                     stop_strings=case.stop, tokenizer=case.tok, on_text=pieces.append)
        out.append((g, "".join(pieces)))
    return out, 1


def by_scheduler(parallel: int):
    def serve(model, case: Case, loop) -> tuple[list, int]:
        sizes = []

        class Recording(EagerBatchEngine):
            def step(self, tokens):
                sizes.append(len(self.rows))
                return super().step(tokens)

        s = Scheduler(model, case.tok, max_queue=len(PROMPTS), parallel=parallel, engine_factory=Recording)
        try:
            jobs = [s.submit(Job(p, case.max_tokens, case.sampling, None, case.stop, loop)) for p in PROMPTS]
            answers = [_answer(loop, j) for j in jobs]
        finally:
            s.close()
        return answers, max(sizes)
    return serve


def _answer(loop, job: Job):
    """(the Generation, the text streamed before it)."""
    pieces = []
    while True:
        kind, value = asyncio.run_coroutine_threadsafe(asyncio.wait_for(job.events.get(), WAIT), loop).result()
        if kind == "text":
            pieces.append(value)
        elif kind == "done":
            return value, "".join(pieces)
        else:
            raise value


PATHS = {"generate": by_generate, "scheduler, one row": by_scheduler(1), "scheduler, batched": by_scheduler(3)}


@pytest.mark.parametrize("name", ["eos", "stop string", "length", "repetition penalty"])
@pytest.mark.parametrize("path", list(PATHS))
def test_every_path_stops_as_the_reference(tiny, cases, loop, path, name):
    case = cases[name]
    answers, rows = PATHS[path](tiny, case, loop)
    for prompt, (g, streamed) in zip(PROMPTS, answers, strict=True):
        want = reference(tiny, prompt, case)
        assert (g.tokens, g.stop_reason, g.text) == want, f"prompt of {len(prompt)} tokens"
        assert streamed == g.text  # nothing past a stop string was streamed, nothing held back at the end
    assert rows >= 2 if path == "scheduler, batched" else rows == 1  # requests decoded together, or alone

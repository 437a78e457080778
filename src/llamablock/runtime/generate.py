"""Text generation: prefill the prompt into the KV cache, then decode one token at a time.

    prefill   one forward pass over the whole prompt; fills the preallocated cache
    decode    one forward pass per new token, t = 1: attention reads the cache with the grouped
              matmul (llamablock.attention), nothing is recomputed for earlier tokens
What each token is and when to stop (end of sequence, a stop string, max_new_tokens) is the
request's (llamablock.runtime.request.Request): the server's scheduler applies the same rules to
each row of its batch. Text streams through `on_text`: each call gets the newly final characters.

`generate` runs an engine of llamablock.runtime.engine (prefill, step): EagerEngine(model) for a
Decoder, RecomputeEngine(model) for the reference without a cache, or a compiled engine of
llamablock.fast; it never looks at which. `generate_batch` runs several prompts together on the
eager batch engine (llamablock.runtime.batch), each row its own Request, so each row stops and
computes what it would alone (tested).
"""

from __future__ import annotations

import time
from typing import Callable, Sequence

import torch

from llamablock.model import Decoder
from llamablock.runtime.batch import EagerBatchEngine
from llamablock.runtime.request import Generation, Request, check_request
from llamablock.runtime.sampling import Sampling

__all__ = ["Generation", "check_request", "generate", "generate_batch"]


@torch.no_grad()
def generate(engine, prompt_ids: Sequence[int], max_new_tokens: int = 64, sampling: Sampling | None = None, *,
             seed: int | None = None, eos_ids: Sequence[int] = (), stop_strings: Sequence[str] = (),
             tokenizer=None, on_text: Callable[[str], None] | None = None) -> Generation:
    """Continue one prompt on `engine` (llamablock.runtime.engine's interface)."""
    if isinstance(engine, Decoder):  # a clear line instead of "'Decoder' object has no attribute 'prepare'"
        raise TypeError("generate runs an engine: pass llamablock.runtime.engine.EagerEngine(model), not the Decoder")
    prompt = list(prompt_ids)
    check_request(engine, len(prompt), max_new_tokens)
    request = Request(prompt, max_new_tokens, sampling, seed=seed, eos_ids=eos_ids, stop_strings=stop_strings,
                      tokenizer=tokenizer, on_text=on_text, device=getattr(engine, "device", torch.device("cpu")))
    n = len(prompt)
    engine.prepare(n + max_new_tokens)  # allocate, build, compile before the clock: decode_seconds is decoding only

    t0 = time.perf_counter()
    logits = engine.prefill(request.ids[:, :n])  # (1, V)
    t1 = time.perf_counter()
    steps = 0
    while request.take(logits).stop is None:
        pos = request.length - 1  # the newest token's position
        logits = engine.step(request.ids[:, pos: pos + 1], pos)
        steps += 1
    return request.result(t1 - t0, time.perf_counter() - t1, steps)


@torch.no_grad()
def generate_batch(model, prompts: Sequence[Sequence[int]], max_new_tokens: int = 64, sampling: Sampling | None = None,
                   *, seed: int | None = None, eos_ids: Sequence[int] = ()) -> list[list[int]]:
    """Continue several prompts together: each prompt's new tokens, as `generate` would give them
    alone. The prompts are prefilled in one left-padded forward (one at a time where the model's
    RoPE follows the sequence length), then decoded as one batch; each row leaves at its own stop.
    A seed seeds each row's own generator."""
    if not prompts:
        raise ValueError("give at least one prompt")
    width = max(len(p) for p in prompts)
    engine = EagerBatchEngine(model, rows=len(prompts), chunk=len(prompts) * max(width, 1))
    waiting = [engine.add(p, max_new_tokens) for p in prompts]
    requests = [Request(p, max_new_tokens, sampling, seed=seed, eos_ids=eos_ids, device=engine.device) for p in prompts]
    of = {id(row): r for row, r in zip(waiting, requests, strict=True)}
    while waiting or engine.rows:
        room = (engine.max_rows or len(prompts)) - len(engine.rows)
        if waiting and room > 0:
            for row, logits in engine.prefill_next(waiting[:room]):
                waiting.remove(row)
                if of[id(row)].take(logits).stop is not None:
                    engine.remove(row)
        rows = list(engine.rows)
        if rows:
            logits = engine.step(torch.tensor([of[id(r)].new[-1] for r in rows], device=engine.device))  # (b, V)
            for i, row in enumerate(rows):
                if of[id(row)].take(logits[i:i + 1]).stop is not None:
                    engine.remove(row)
    return [r.new for r in requests]

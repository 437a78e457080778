"""Text generation: prefill the prompt into the KV cache, then decode one token at a time.

    prefill   one forward pass over the whole prompt; fills the preallocated cache
    decode    one forward pass per new token, t = 1: attention reads the cache with the grouped
              matmul (llamablock.attention), nothing is recomputed for earlier tokens
Stops on an end-of-sequence id, on a stop string (needs the tokenizer), or after
max_new_tokens. Text streams through `on_text`: each call gets the newly final characters,
holding back an incomplete UTF-8 character and anything that could still become a stop string.

`generate` runs an engine of llamablock.runtime.engine (prefill, step): EagerEngine(model) for a
Decoder, RecomputeEngine(model) for the reference without a cache, or a compiled engine of
llamablock.fast; it never looks at which.

Batches: prompts of different lengths are left-padded to the longest, so every row's next token
sits in the same column; `pad_mask` hides padding keys and position_ids count real tokens only,
so each row computes what it would alone (tested).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Sequence

import torch

from llamablock.kv_cache import KVCache
from llamablock.model import Decoder
from llamablock.runtime.sampling import Sampling, next_token


@dataclass
class Generation:
    tokens: list[int]  # new tokens, including the end-of-sequence token that stopped it
    prompt_tokens: int
    stop_reason: str  # "eos" | "stop_string" | "length"
    prefill_seconds: float = 0.0
    decode_seconds: float = 0.0
    decode_steps: int = 0  # forward passes after the prefill
    text: str | None = None
    extra: dict = field(default_factory=dict)

    @property
    def prefill_tokens_per_s(self) -> float:
        return self.prompt_tokens / self.prefill_seconds if self.prefill_seconds > 0 else float("nan")

    @property
    def decode_tokens_per_s(self) -> float:
        return self.decode_steps / self.decode_seconds if self.decode_seconds > 0 else float("nan")


def check_request(model, n_prompt: int, max_new_tokens: int) -> None:
    if n_prompt == 0:
        raise ValueError("the prompt is empty: give some text (or token ids) to continue")
    if not isinstance(max_new_tokens, int) or max_new_tokens <= 0:
        raise ValueError(f"max_new_tokens must be a positive integer, got {max_new_tokens!r}")
    ctx = model.cfg.max_seq_len
    if n_prompt + max_new_tokens > ctx:
        raise ValueError(f"the prompt ({n_prompt} tokens) plus {max_new_tokens} new tokens exceeds the model's "
                         f"context of {ctx} tokens; shorten the prompt or ask for fewer new tokens")


def _model_dtype(model) -> torch.dtype:
    return model.embed.weight.dtype


class _TextStream:
    """Decodes the new tokens and releases text that can no longer change."""

    def __init__(self, tokenizer, stop_strings: Sequence[str], on_text: Callable[[str], None] | None):
        # An empty stop string would match before any text: it is ignored (the command refuses it).
        self.tok, self.stops, self.on_text = tokenizer, [s for s in stop_strings if s], on_text
        self.hold = max((len(s) for s in self.stops), default=1) - 1
        self.sent = 0
        self.text = ""

    def update(self, ids: list[int], final: bool = False) -> bool:
        """Returns True when a stop string has appeared (self.text is cut before it)."""
        text = self.tok.decode(ids, skip_special_tokens=True)
        hits = [text.find(s) for s in self.stops if s and s in text]
        stopped = bool(hits)
        if stopped:
            text = text[: min(hits)]
        self.text = text
        end = len(text) if (final or stopped) else len(text) - self.hold
        while end > self.sent and text[end - 1] == "\ufffd" and not (final or stopped):
            end -= 1  # an incomplete UTF-8 sequence: wait for its other bytes
        if self.on_text is not None and end > self.sent:
            self.on_text(text[self.sent:end])
            self.sent = end
        return stopped


@torch.no_grad()
def generate(engine, prompt_ids: Sequence[int], max_new_tokens: int = 64, sampling: Sampling | None = None, *,
             seed: int | None = None, eos_ids: Sequence[int] = (), stop_strings: Sequence[str] = (),
             tokenizer=None, on_text: Callable[[str], None] | None = None) -> Generation:
    """Continue one prompt on `engine` (llamablock.runtime.engine's interface)."""
    if isinstance(engine, Decoder):  # a clear line instead of "'Decoder' object has no attribute 'prepare'"
        raise TypeError("generate runs an engine: pass llamablock.runtime.engine.EagerEngine(model), not the Decoder")
    prompt = list(prompt_ids)
    check_request(engine, len(prompt), max_new_tokens)
    if stop_strings and tokenizer is None:
        raise ValueError("stop strings need the tokenizer")
    s = sampling or Sampling()
    device = getattr(engine, "device", torch.device("cpu"))
    gen = torch.Generator(device=device).manual_seed(seed) if seed is not None else None
    n = len(prompt)
    seq = torch.empty(1, n + max_new_tokens, dtype=torch.long, device=device)  # prompt then new tokens, (1, n + new)
    seq[0, :n] = torch.tensor(prompt, device=device)
    eos = set(int(e) for e in eos_ids)
    stream = _TextStream(tokenizer, stop_strings, on_text) if tokenizer is not None else None
    engine.prepare(n + max_new_tokens)  # allocate, build, compile before the clock: decode_seconds is decoding only

    t0 = time.perf_counter()
    logits = engine.prefill(seq[:, :n])  # (1, V)
    t1 = time.perf_counter()
    new: list[int] = []
    reason, steps = "length", 0
    while True:
        tok = next_token(logits, seq[:, : n + len(new)], s, gen)  # (1,)
        seq[0, n + len(new)] = tok[0]
        new.append(int(tok[0]))
        if new[-1] in eos:
            reason = "eos"
            break
        if stream is not None and stream.update(new):
            reason = "stop_string"
            break
        if len(new) == max_new_tokens:
            break
        cur = n + len(new)
        logits = engine.step(seq[:, cur - 1: cur], cur - 1)
        steps += 1
    t2 = time.perf_counter()
    if stream is not None and reason != "stop_string":
        stream.update(new, final=True)
    return Generation(new, n, reason, t1 - t0, t2 - t1, steps, stream.text if stream is not None else None)


@torch.no_grad()
def generate_batch(model, prompts: Sequence[Sequence[int]], max_new_tokens: int = 64, sampling: Sampling | None = None,
                   *, seed: int | None = None, eos_ids: Sequence[int] = (), pad_id: int = 0) -> list[list[int]]:
    """Continue several prompts together, left-padded. Each row stops at its own EOS."""
    if not prompts:
        raise ValueError("give at least one prompt")
    for p in prompts:
        check_request(model, len(p), max_new_tokens)
    s = sampling or Sampling()
    device = model.embed.weight.device
    gen = torch.Generator(device=device).manual_seed(seed) if seed is not None else None
    b, width = len(prompts), max(len(p) for p in prompts)
    total = width + max_new_tokens
    seq = torch.full((b, total), pad_id, dtype=torch.long, device=device)  # (b, width + new)
    real = torch.zeros(b, total, dtype=torch.bool, device=device)  # True on real tokens, by cache slot
    for i, p in enumerate(prompts):
        seq[i, width - len(p): width] = torch.tensor(list(p), device=device)
        real[i, width - len(p): width] = True
    positions = (real[:, :width].cumsum(1) - 1).clamp(min=0)  # (b, width): 0 at each row's first real token
    cache = KVCache(model.cfg, b, total, dtype=_model_dtype(model), device=device)
    logits = model(seq[:, :width], position_ids=positions, cache=cache, pad_mask=real[:, :width], last_only=True)[:, -1]
    next_pos = real[:, :width].sum(1, keepdim=True)  # (b, 1)
    eos = torch.tensor(sorted(set(int(e) for e in eos_ids)), dtype=torch.long, device=device)
    done = torch.zeros(b, dtype=torch.bool, device=device)
    out: list[list[int]] = [[] for _ in range(b)]
    for step in range(max_new_tokens):
        # Padding is masked out of the repetition penalty by pointing it at a real token of the row.
        hist = torch.where(real[:, : width + step], seq[:, : width + step], seq[:, width - 1: width])
        tok = next_token(logits, hist, s, gen)  # (b,)
        for i in range(b):
            if not done[i]:
                out[i].append(int(tok[i]))
        done |= torch.isin(tok, eos)
        seq[:, width + step] = tok
        real[:, width + step] = True
        if bool(done.all()) or step == max_new_tokens - 1:
            break
        logits = model(tok[:, None], position_ids=next_pos, cache=cache, pad_mask=real[:, : width + step + 1])[:, -1]
        next_pos = next_pos + 1
    return out

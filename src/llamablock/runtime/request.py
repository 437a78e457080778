"""One request, from its first logits to its stop: the rules every way of serving it obeys.

A `Request` holds what choosing the next token needs and what decides that the sequence ends:

    sampling     temperature, top-k/top-p and the repetition penalty (llamablock.runtime.sampling),
                 with its own torch.Generator when seeded, so a seeded request draws the same
                 numbers alone or among others
    ids          (1, prompt + max new tokens): the prompt, then each token taken; the history
                 the repetition penalty reads, and the input ids of `generate`'s steps
    stream       the text so far (`TextStream`), released to `on_text` once it can no longer change
    stop rules   an end-of-sequence id ("eos"), a stop string, which may span several tokens and is
                 found in the decoded text ("stop_string"), max_new_tokens ("length")

`take(logits)` chooses the next token and applies the stop rules, in that order: `generate`
(one sequence on an engine), `generate_batch` and the server's scheduler (rows of a batch engine)
call it for every token, so the three stop alike (tests/faces/test_request_paths.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, NamedTuple, Sequence

import torch

from llamablock.runtime.sampling import Sampling, next_token


def check_request(model, n_prompt: int, max_new_tokens: int) -> None:
    """Refuse an empty prompt, a non-positive length, or a request longer than the model's context
    (an engine with a context overflow policy, `unbounded`, takes any length)."""
    if n_prompt == 0:
        raise ValueError("the prompt is empty: give some text (or token ids) to continue")
    if not isinstance(max_new_tokens, int) or max_new_tokens <= 0:
        raise ValueError(f"max_new_tokens must be a positive integer, got {max_new_tokens!r}")
    ctx = model.cfg.max_seq_len
    if getattr(model, "unbounded", False):  # a context overflow policy (runtime/overflow.py) takes any length
        return
    if n_prompt + max_new_tokens > ctx:
        raise ValueError(f"the prompt ({n_prompt} tokens) plus {max_new_tokens} new tokens exceeds the model's "
                         f"context of {ctx} tokens; shorten the prompt or ask for fewer new tokens")


@dataclass
class Generation:
    """What a finished request produced, and how long its two phases took."""

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


class TextStream:
    """Decodes the new tokens and releases text that can no longer change: it holds back an
    incomplete UTF-8 character, and the last (longest stop string - 1) characters, which could
    still become a stop string with the next token."""

    def __init__(self, tokenizer, stop_strings: Sequence[str], on_text: Callable[[str], None] | None):
        # An empty stop string would match before any text: it is ignored (the command refuses it).
        self.tok, self.stops, self.on_text = tokenizer, [s for s in stop_strings if s], on_text
        self.hold = max((len(s) for s in self.stops), default=1) - 1
        self.sent = 0
        self.text = ""

    def update(self, ids: list[int], final: bool = False) -> bool:
        """Returns True when a stop string has appeared (self.text is cut before it)."""
        text = self.tok.decode(ids, skip_special_tokens=True)
        hits = [text.find(s) for s in self.stops if s in text]
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


class Taken(NamedTuple):
    token: int
    stop: str | None  # why the request stopped at this token ("eos", "stop_string", "length"), else None


class Request:
    """One sequence's sampling, history, text stream and stop rules (the module docstring).
    Stop strings need the tokenizer; without one no text is decoded (`text` is None)."""

    def __init__(self, prompt_ids: Sequence[int], max_new_tokens: int, sampling: Sampling | None = None, *,
                 seed: int | None = None, eos_ids: Sequence[int] = (), stop_strings: Sequence[str] = (),
                 tokenizer=None, on_text: Callable[[str], None] | None = None,
                 device: torch.device | str = "cpu"):
        if stop_strings and tokenizer is None:
            raise ValueError("stop strings need the tokenizer")
        self.prompt = list(prompt_ids)
        self.max_new_tokens = max_new_tokens
        self.sampling = sampling or Sampling()
        self.eos = frozenset(int(e) for e in eos_ids)
        self.generator = torch.Generator(device=device).manual_seed(seed) if seed is not None else None
        n = len(self.prompt)
        self.ids = torch.empty(1, n + max_new_tokens, dtype=torch.long, device=device)  # (1, n + new)
        self.ids[0, :n] = torch.tensor(self.prompt, dtype=torch.long, device=device)
        self.new: list[int] = []
        self.stream = TextStream(tokenizer, stop_strings, on_text) if tokenizer is not None else None
        self.stop_reason: str | None = None

    @property
    def prompt_tokens(self) -> int:
        return len(self.prompt)

    @property
    def length(self) -> int:
        """Tokens so far: the prompt and the new ones."""
        return len(self.prompt) + len(self.new)

    @property
    def text(self) -> str | None:
        return self.stream.text if self.stream is not None else None

    def take(self, logits: torch.Tensor) -> Taken:
        """logits (1, V) of the next position -> the token chosen, and why the request stops there
        (None: it goes on). Once stopped, the rest of the text is released."""
        if self.stop_reason is not None:
            raise ValueError(f"the request has stopped ({self.stop_reason}): it takes no more tokens")
        n = self.length
        tok = int(next_token(logits, self.ids[:, :n], self.sampling, self.generator)[0])
        self.ids[0, n] = tok
        self.new.append(tok)
        self.stop_reason = self._stop(tok)
        if self.stop_reason not in (None, "stop_string") and self.stream is not None:
            self.stream.update(self.new, final=True)  # a stop string's cut text is final already
        return Taken(tok, self.stop_reason)

    def _stop(self, tok: int) -> str | None:
        if tok in self.eos:
            return "eos"
        if self.stream is not None and self.stream.update(self.new):
            return "stop_string"
        if len(self.new) == self.max_new_tokens:
            return "length"
        return None

    def result(self, prefill_seconds: float = 0.0, decode_seconds: float = 0.0, decode_steps: int = 0) -> Generation:
        """The finished request as a Generation, with the caller's timings."""
        if self.stop_reason is None:
            raise ValueError("the request has not stopped yet")
        return Generation(list(self.new), len(self.prompt), self.stop_reason, prefill_seconds, decode_seconds,
                          decode_steps, self.text)

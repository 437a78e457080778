"""Choosing the next token from logits: greedy, temperature, top-k, top-p, repetition penalty.

Order of operations, as transformers' `generate` applies its logits processors: repetition
penalty, then temperature, then top-k, then top-p, then a draw. Temperature 0 means greedy
(argmax), which ignores the other filters except the penalty.
Repetition penalty (Keskar et al. 2019, CTRL): for every token already in the sequence, a
positive logit is divided by the penalty and a negative one multiplied by it.
Top-p (Holtzman et al. 2019): keep the smallest set of most likely tokens whose probability
sums to at least p; the most likely token is always kept.
Shapes: the package legend (llamablock/__init__.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch


@dataclass
class Sampling:
    temperature: float = 0.0  # 0: greedy
    top_k: int = 0  # 0: no limit
    top_p: float = 1.0  # 1: no limit
    repetition_penalty: float = 1.0  # 1: none

    def __post_init__(self):
        for name in ("temperature", "top_p", "repetition_penalty"):
            if not math.isfinite(getattr(self, name)):
                raise ValueError(f"{name} must be a finite number, got {getattr(self, name)}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0 (0 is greedy), got {self.temperature}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0 (0 keeps all tokens), got {self.top_k}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.repetition_penalty <= 0:
            raise ValueError(f"repetition_penalty must be > 0 (1 is none), got {self.repetition_penalty}")


def apply_repetition_penalty(logits: torch.Tensor, history: torch.Tensor, penalty: float) -> torch.Tensor:
    """logits (b, V), history (b, n) token ids already in each sequence."""
    if penalty == 1.0 or history.numel() == 0:
        return logits
    seen = logits.gather(1, history)  # (b, n)
    seen = torch.where(seen > 0, seen / penalty, seen * penalty)
    return logits.scatter(1, history, seen)


def filter_top_k_top_p(logits: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """Set logits outside the top-k / top-p set to -inf. logits (b, V)."""
    if top_k and top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[:, -1:]  # (b, 1)
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
        probs = sorted_logits.softmax(-1)
        # drop a token when the tokens before it already reach p
        drop = probs.cumsum(-1) - probs >= top_p
        drop[:, 0] = False
        logits = logits.masked_fill(drop.scatter(1, order, drop), float("-inf"))
    return logits


def next_token(logits: torch.Tensor, history: torch.Tensor, s: Sampling,
               generator: torch.Generator | None = None) -> torch.Tensor:
    """logits (b, V) of the last position -> token ids (b,)."""
    logits = apply_repetition_penalty(logits.float(), history, s.repetition_penalty)
    if s.temperature < torch.finfo(torch.float32).tiny:  # 0, or so small that it is 0 in float32: greedy
        return logits.argmax(-1)
    # Shifted by the row's maximum before dividing (softmax does not change): a tiny temperature
    # then sends the others to -inf instead of overflowing every logit to inf.
    logits = filter_top_k_top_p((logits - logits.amax(-1, keepdim=True)) / s.temperature, s.top_k, s.top_p)
    return torch.multinomial(logits.softmax(-1), 1, generator=generator)[:, 0]


# Chat sampling when neither the user nor the model says otherwise: Ollama's defaults (its Modelfile
# documentation: temperature 0.8, top_k 40, top_p 0.9, repeat_penalty 1.1). Greedy decoding of a
# small chat model repeats itself (a line, then the same line again), and so does sampling without
# the penalty; the penalty here applies to every earlier token, where Ollama's looks 64 back.
CHAT_DEFAULTS = {"temperature": 0.8, "top_k": 40, "top_p": 0.9, "repetition_penalty": 1.1}
FIELDS = ("temperature", "top_k", "top_p", "repetition_penalty")


def sampling_for(given: dict, model_defaults: dict | None = None, chat: bool = False, greedy: bool = False) -> Sampling:
    """The sampling of a request: each setting the user `given` (None: not given), else the model's
    generation_config.json (`model_defaults`: transformers' keys; do_sample false means greedy),
    else CHAT_DEFAULTS for a chat and greedy for a plain continuation. `greedy` wins over all."""
    if greedy:
        # the ignored settings are still checked: an out-of-range value is a mistake to name, not to drop
        Sampling(**{k: v for k, v in given.items() if k in FIELDS and v is not None})
        return Sampling(0.0, 0, 1.0, given.get("repetition_penalty") or 1.0)
    base = dict(temperature=0.0, top_k=0, top_p=1.0, repetition_penalty=1.0)
    if model_defaults:
        if model_defaults.get("do_sample"):  # transformers' defaults for keys the file leaves out
            base.update(temperature=1.0, top_k=50, top_p=1.0)
            base.update({k: model_defaults[k] for k in ("temperature", "top_k", "top_p") if model_defaults.get(k) is not None})
        if model_defaults.get("repetition_penalty") is not None:
            base["repetition_penalty"] = model_defaults["repetition_penalty"]
    elif chat:
        base.update(CHAT_DEFAULTS)
    base.update({k: v for k, v in given.items() if k in FIELDS and v is not None})
    return Sampling(float(base["temperature"]), int(base["top_k"]), float(base["top_p"]), float(base["repetition_penalty"]))

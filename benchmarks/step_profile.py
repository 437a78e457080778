"""Where a step's time goes: the block kernel, attention, and the rest, for the misses of bench size.

The issue's rule for a missed target is a measured reason, not a guess. This runs the plain
command's engine (the default plan, eager, denormals flushed as the command flushes them:
llamablock.util.denormals) in this process on the given threads and times, with
`time.perf_counter` around each call, every block-kernel matrix product (each BlockLinear's
binding: the weights' reads and their integer sums), the attention core (`Attention.attend`: the
scores over the cache, softmax, the weighted values) and the whole step; the rest is the step less
both (norms, RoPE, the cache's writes, the embedding, Python per layer). Wrapping adds two clock
reads per call, a few microseconds of the step, which the rest absorbs. Where the plan runs decode
steps in C (fast/decode_step.py), the C clocks the same two parts inside the step
(DecodeStep.clock: its products, and scores, softmax and values over the cache), the head beside it.
"""

from __future__ import annotations

import time
from contextlib import contextmanager

import torch


class _Clock:
    """Seconds spent inside the wrapped calls, and how many."""

    def __init__(self):
        self.seconds, self.calls, self.layers = 0.0, 0, 0

    def wrap(self, fn):
        def timed(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.seconds += time.perf_counter() - t0
                self.calls += 1

        return timed


@contextmanager
def _clocked(model):
    """(kernel clock, attention clock) while every BlockLinear's binding and Attention.attend are timed."""
    from llamablock.attention import Attention
    from llamablock.fast.kernels.file_blocks import BlockLinear

    kernel, attention = _Clock(), _Clock()
    embedding = {id(m.rows) for m in model.modules() if isinstance(getattr(m, "rows", None), BlockLinear)}
    layers = [m for m in model.modules() if isinstance(m, BlockLinear) and id(m) not in embedding]  # multiplying ones
    bindings = [m.binding for m in layers]
    attend = Attention.attend
    kernel.layers = len(layers)
    for m in layers:
        m.binding = kernel.wrap(m.binding)
    Attention.attend = attention.wrap(attend)
    try:
        yield kernel, attention
    finally:
        for m, b in zip(layers, bindings, strict=True):
            m.binding = b
        Attention.attend = attend


def profile(path, prompt_tokens: int, steps: int) -> dict[str, dict[str, float]]:
    """{'decode': ..., 'prefill': ...}, each {'step', 'kernel', 'attention', 'rest'} in seconds (a
    decode step at position prompt_tokens, the median of `steps`, with the calls of one step; one
    prefill of prompt_tokens)."""
    import statistics

    from llamablock.fast.plan import build, decide
    from llamablock.io.source import open_source
    from llamablock.util.denormals import flushed_denormals

    source = open_source(path, tokenizer=False)
    engine = build(source, decide(source, "auto", "eager")).engine
    ids = torch.randint(0, source.cfg.vocab_size, (1, prompt_tokens), generator=torch.Generator().manual_seed(0))
    out = {}
    with torch.inference_mode(), flushed_denormals(), _clocked(engine.model) as (kernel, attention):
        engine.prepare(prompt_tokens + steps + 2)
        engine.prefill(ids[:, :8])  # warm: the kernel's library, first-call allocations
        engine.prepare(prompt_tokens + steps + 2)
        kernel.seconds = attention.seconds = 0.0
        t0 = time.perf_counter()
        engine.prefill(ids)
        total = time.perf_counter() - t0
        out["prefill"] = {"step": total, "kernel": kernel.seconds, "attention": attention.seconds}
        rows, c_step, inside = [], getattr(engine, "c_step", None), torch.zeros(2, dtype=torch.float64)
        for i in range(steps):
            kernel.seconds = attention.seconds = 0.0
            kernel.calls = attention.calls = 0
            if c_step is not None:
                c_step.clock(inside.zero_())
            t0 = time.perf_counter()
            engine.step(ids[:, i % prompt_tokens:i % prompt_tokens + 1], prompt_tokens + i)
            step = time.perf_counter() - t0
            rows.append((step, kernel.seconds + inside[0].item(), attention.seconds + inside[1].item()))  # C: the
            # layers' parts; torch's clocks: the head (a BlockLinear) beside them, or every part of an eager step
        if c_step is not None:
            c_step.clock(None)
        pick = sorted(rows)[len(rows) // 2]  # the median step, with its own parts
        out["decode"] = {"step": pick[0], "kernel": pick[1], "attention": pick[2], "block layers": kernel.layers,
                         "kernel calls": kernel.calls, "attention calls": attention.calls}  # those of one step
    for part in out.values():
        part["rest"] = part["step"] - part["kernel"] - part["attention"]
    out["decode"]["spread"] = statistics.pstdev(r[0] for r in rows)
    return out


def rows(mix: str, prof: dict, prompt_tokens: int) -> list[list[str]]:
    """Table rows: phase, ms, and each part's ms and share."""
    out = []
    for phase in ("decode", "prefill"):
        p = prof[phase]
        what = f"decode step at position {prompt_tokens}" if phase == "decode" else f"prefill of {prompt_tokens}"
        out.append([mix, what, f"{p['step'] * 1e3:.1f}",
                    *(f"{p[k] * 1e3:.1f} ({p[k] / p['step']:.0%})" for k in ("kernel", "attention", "rest"))])
    return out

"""The model that `llamablock serve` puts behind /v1: `ServedModel` (a name, the model, its
tokenizer, the scheduler that runs its requests) and `load_served`, which builds one from a
`--model` argument.

Requests run on llamablock.web.scheduler (continuous batching behind a bounded queue).

How requests are served is the plan's `serving` (fast/plan.py): "batch", the eager batch engine
(llamablock.runtime.batch.EagerBatchEngine), or "compiled batch", whose step is the compiled
engine's (llamablock.fast.compiled.batch_compiled.CompiledBatchEngine, one row for `--parallel 1`):
a request runs in a compiled row when the engine already covers its length (its programs loaded
or compiled before serving began: nothing is compiled inside a request), every other request on
the eager model beside it.
"""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass

import torch

from llamablock.runtime.batch import EagerBatchEngine
from llamablock.web.scheduler import Scheduler


@dataclass
class ServedModel:
    """The model behind /v1: its id, the Decoder, its tokenizer and the worker that runs it.
    `aliases`: other names a request may give for it (the path it was loaded from)."""

    name: str
    model: object
    tokenizer: object
    worker: Scheduler
    created: int = 0
    aliases: tuple[str, ...] = ()


def load_served(model: str | None = None, max_queue: int = 8, compile_tokens: int | None = None,
                device: str = "cpu", parallel: int = 4, chunk: int = 256, engine: str = "auto",
                scaling=None) -> ServedModel:
    """Load a model (a name or path as `llamablock generate --model` takes, or a run directory) and
    start its worker, the file read once (fast/plan.py). Requests run on the eager engine, in the
    file's own precision; the compiled engine serves the requests it covers when `llamablock compile`
    has built it for this model for `parallel` sequences at once (`--batch`; fast/compiled/builds.py), or
    when `compile_tokens` asks for it: then it is prepared now for requests up to that many tokens,
    loaded from the compile cache or compiled once, so that no request waits for a compilation.
    Its step decodes `parallel` rows (llamablock.fast.compiled.batch_compiled), one with `parallel`
    1. With a compiled engine the eager model is made from the same weights (plan.eager_beside).
    `engine` is fast/plan.py's choice: "eager" never compiles, "compiled" prepares the compiled
    engine whatever the builds say. `scaling`: the command's parsed context and RoPE-scaling flags
    (io/scaling_flags.py), applied to the model before the plan; a model they change runs eagerly."""
    from llamablock.fast.plan import build, decide, eager_beside, prepare
    from llamablock.io.scaling_flags import scaled_source
    from llamablock.io.source import open_source

    own = open_source(model)  # the plan refuses a compiled engine off the CPU, before any weight is read
    source = own if scaling is None else scaled_source(own, scaling)
    plan = decide(source, "auto", "compiled" if compile_tokens else engine, device, batch=parallel,
                  rescaled=source.cfg != own.cfg)
    built = build(source, plan)
    compiled = None
    if plan.serving == "compiled batch":
        compiled, m = built.engine, eager_beside(built, plan)
        # --engine compiled with nothing built: `llamablock compile`'s default length
        prepare(compiled, source, min(compile_tokens or plan.built or 512, source.cfg.max_seq_len), plan.scaled)
    else:
        m = built.model
    arg = model or source.name
    # the eager rows keep the plan's cache dtype (a 16-bit cache for a quantized file), as generate's
    # and the rows step in C where the plan runs generate's steps there (plan.c_step)
    eager_rows = functools.partial(EagerBatchEngine, kv_dtype=getattr(torch, plan.kv),
                                   c_step=getattr(built.engine, "c_step", None))
    worker = Scheduler(m, source.tokenizer, max_queue, compiled, parallel=parallel, chunk=chunk,
                       engine_factory=eager_rows)
    return ServedModel(source.name, m, source.tokenizer, worker, int(time.time()), (arg,))

"""The model that `llamablock serve` puts behind /v1: `ServedModel` (a name, the model, its
tokenizer, the scheduler that runs its requests) and `load_served`, which builds one from a
`--model` argument.

Requests run on llamablock.web.scheduler (continuous batching behind a bounded queue); its
names are re-exported here for the code that imports them from this module.

Engines: with `--parallel 1`, a request runs on the compiled engine
(llamablock.fast.compiled_decode.AOTIEngine) when one is given and already covers the request's
length (its programs loaded or compiled before serving began: nothing is compiled inside a
request); every other request, and every batch, on the eager engine.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from llamablock.web.scheduler import Busy, Cancelled, Job, Scheduler  # noqa: F401  (re-exported)

GenerationWorker = Scheduler  # the name load_served builds


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
    """Load a model (a name or path as `llamablock generate --model` takes, or a run directory) in
    its own precision (llamablock.fast.native) and start its worker. The compiled engine serves the
    requests it covers when `llamablock compile` has built it for this model (llamablock.fast.builds),
    or when `compile_tokens` asks for it: then it is prepared now for requests up to that many
    tokens, loaded from the compile cache or compiled once, so that no request waits for a
    compilation; longer requests run eagerly."""
    from llamablock.fast import builds
    from llamablock.fast.native import engine_format, load_model
    from llamablock.io.loading import load_pretrained
    from llamablock.io.resolve import DEFAULT_MODEL, EMBEDDED, resolve_model

    m, tok, _ = load_model(model, "auto", device)
    path = resolve_model(model)
    if compile_tokens and device != "cpu":
        raise ValueError(f"the compiled engine runs on the CPU; serve with --device cpu to use --compile, not {device}")
    # the format costs another parse of a GGUF's header: only where an engine is asked for or built
    fmt = engine_format(path) if compile_tokens or (device == "cpu" and builds.any_build(path)) else None
    tokens = compile_tokens or (builds.built_length(path, fmt) if fmt else None)
    compiled = None
    if tokens:
        from llamablock.fast.compiled_decode import AOTIEngine
        from llamablock.fast.quant import load_dtype

        compiled = AOTIEngine(load_pretrained(path, load_dtype(fmt)), fmt, autotune=builds.autotuned(path, fmt))
        seconds = compiled.prepare(min(tokens, m.cfg.max_seq_len))
        if compiled.running.get("step") != "eager":
            builds.record(path, fmt, compiled.length, compiled.packages(), seconds, autotune=compiled.autotune)
    arg = model or DEFAULT_MODEL
    name = arg if arg in EMBEDDED else Path(arg).name
    return ServedModel(name, m, tok, GenerationWorker(m, tok, max_queue, compiled), int(time.time()), (arg,))

"""`llamablock serve`: the interactive page of the module's five figures and an OpenAI-compatible
API for one model, on one local port.

FastAPI app from llamablock.web.app, run by uvicorn. The page (page, scripts, style) comes from
the package itself, so it works with no network. The model behind /v1 (llamablock.web.api_openai)
is loaded before the server listens: a name or path as `llamablock generate --model` takes, or a
training run directory (its latest checkpoint). Without --model the embedded default is served,
and when its package is not installed, the page alone.
"""

from __future__ import annotations

import sys

from llamablock.commands import UsageError
from llamablock.io.scaling_flags import add_scaling_arguments, check_flags


def add_arguments(p) -> None:
    p.add_argument("--host", default="127.0.0.1",
                   help="address to listen on (default: %(default)s, this machine only; 0.0.0.0 for all)")
    p.add_argument("--port", type=int, default=8000, help="TCP port (default: %(default)s)")
    p.add_argument("--model", default=None, metavar="PATH|NAME",
                   help="the model behind /v1: a .gguf file, a transformers directory, a training run directory "
                        "or an embedded model name (default: smollm2-135m-instruct)")
    p.add_argument("--device", choices=("auto", "cpu", "cuda", "mps"), default="auto",
                   help="where the model runs (default: auto, the best available); q8/q4 and the compiled engine: CPU")
    p.add_argument("--parallel", type=int, default=4, metavar="N",
                   help="requests generated at once, decoded together as one batch (continuous batching); "
                        "more wait in the queue (default: %(default)s)")
    p.add_argument("--max-queue", type=int, default=8, metavar="N",
                   help="requests that may wait while --parallel others generate; more are answered 503 "
                        "(default: %(default)s)")
    p.add_argument("--prefill-chunk", type=int, default=256, metavar="TOKENS",
                   help="the most prompt tokens prefilled between two decode steps of the running requests: "
                        "smaller keeps their streams steadier while a long prompt arrives (default: %(default)s)")
    p.add_argument("--compile-tokens", type=int, default=None, metavar="TOKENS",
                   help="serve requests of up to TOKENS (prompt + completion) with the compiled engine (its step "
                        "for --parallel sequences at once), prepared before the server listens (loaded from the "
                        "compile cache, or compiled once: minutes); longer requests run eagerly (default: the "
                        "compiled engine where `llamablock compile --batch N` built it for --parallel N, else eager)")
    p.add_argument("--engine", choices=("auto", "eager", "compiled"), default="auto",
                   help="auto: the compiled engine where `llamablock compile` built it for this model and --parallel, "
                        "else eager; eager: never compiled; compiled: prepared before listening, compiling if need "
                        "be, as --compile-tokens (default: %(default)s)")
    p.add_argument("--trace-cache", default=None, metavar="DIR",
                   help="where the token tracer keeps its trained 2017/2024 pair (default: the tracer's own)")
    p.add_argument("--lab-results", default="lab-out/results.json", metavar="FILE",
                   help="results.json of `llamablock lab`, for measured decode times in the gqa figure "
                        "(default: %(default)s; shown as not measured when absent)")
    add_scaling_arguments(p)


def run(args) -> int:
    if not 0 < args.port < 65536:
        raise UsageError(f"--port must be in 1..65535, got {args.port}")
    if args.parallel <= 0:
        raise UsageError(f"--parallel must be a positive integer, got {args.parallel}")
    if args.prefill_chunk <= 0:
        raise UsageError(f"--prefill-chunk must be a positive integer, got {args.prefill_chunk}")
    if args.max_queue <= 0:
        raise UsageError(f"--max-queue must be a positive integer, got {args.max_queue}")
    if args.compile_tokens is not None and args.engine == "eager":
        raise UsageError("--compile-tokens asks for the compiled engine; leave out --engine eager")
    if args.compile_tokens is not None and args.compile_tokens < 2:
        raise UsageError(f"--compile-tokens takes the longest request in tokens (at least 2), got {args.compile_tokens}")
    check_flags(args)  # before the port is bound or the model read
    import socket

    import uvicorn

    from llamablock.web.app import create_app
    from llamablock.web.generation import load_served

    # Bind once here so a taken port is one clear line, not uvicorn's log and exit.
    try:
        with socket.create_server((args.host, args.port)):
            pass
    except OSError as e:
        raise UsageError(f"cannot listen on {args.host}:{args.port}: {e.strerror or e}") from None
    try:
        from llamablock.util.devices import resolve_device

        served = load_served(args.model, args.max_queue, args.compile_tokens, resolve_device(args.device),
                             args.parallel, args.prefill_chunk, engine=args.engine, scaling=args)
    except FileNotFoundError as e:
        if args.model is not None:
            raise
        served = None
        print(f"llamablock serve: no model behind /v1 ({e}); serving the page only", file=sys.stderr)
    url = f"http://{args.host}:{args.port}"
    print(f"llamablock serve: open {url}/  (Ctrl-C to stop)")
    if served is not None:
        print(f"llamablock serve: OpenAI-compatible API at {url}/v1, model {served.name!r}; "
              f"{served.worker.describe()}; counters at {url}/metrics")
        _log_requests()
    # Bound to this machine, the server answers requests addressed to it by its own names only.
    local = args.host in ("127.0.0.1", "localhost", "::1")
    hosts = ["127.0.0.1", "localhost"] if local else None
    app = create_app(trace_cache_dir=args.trace_cache, lab_results=args.lab_results, served=served, hosts=hosts)
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning")
    return 0


def _log_requests() -> None:
    """One line per finished request on stderr (the scheduler's logger, llamablock.serve)."""
    import logging

    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("llamablock serve: %(message)s"))
    log = logging.getLogger("llamablock.serve")
    log.addHandler(handler)
    log.setLevel(logging.INFO)

"""`llamablock serve`: the interactive page of the module's five figures, on a local port.

FastAPI app from llamablock.web.app, run by uvicorn. Everything it serves (page, scripts,
style) comes from the package itself, so it works with no network.
"""

from __future__ import annotations

from llamablock.commands import UsageError


def add_arguments(p) -> None:
    p.add_argument("--host", default="127.0.0.1",
                   help="address to listen on (default: %(default)s, this machine only; 0.0.0.0 for all)")
    p.add_argument("--port", type=int, default=8000, help="TCP port (default: %(default)s)")
    p.add_argument("--trace-cache", default=None, metavar="DIR",
                   help="where the token tracer keeps its trained 2017/2024 pair (default: the tracer's own)")
    p.add_argument("--lab-results", default="lab-out/results.json", metavar="FILE",
                   help="results.json of `llamablock lab`, for measured decode times in the gqa figure "
                        "(default: %(default)s; shown as not measured when absent)")


def run(args) -> int:
    if not 0 < args.port < 65536:
        raise UsageError(f"--port must be in 1..65535, got {args.port}")
    import socket

    import uvicorn

    from llamablock.web.app import create_app

    # Bind once here so a taken port is one clear line, not uvicorn's log and exit.
    try:
        with socket.create_server((args.host, args.port)):
            pass
    except OSError as e:
        raise UsageError(f"cannot listen on {args.host}:{args.port}: {e.strerror or e}") from None
    print(f"llamablock serve: open http://{args.host}:{args.port}/  (Ctrl-C to stop)")
    uvicorn.run(create_app(trace_cache_dir=args.trace_cache, lab_results=args.lab_results), host=args.host, port=args.port, log_level="warning")
    return 0

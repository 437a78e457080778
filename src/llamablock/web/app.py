"""The FastAPI application behind `llamablock serve`: one page, its static files, a JSON API.

    GET /                       the page (static/index.html)
    GET /static/<file>          its scripts and style, from static/ only (no CDN: works offline)
    GET /api/rope-visualizer    15.1   api_rope.py
    GET /api/rope-scaling       15.2   api_rope.py (from llamablock.diagnostics.rope_table)
    GET /api/swiglu-gate        15.4   api_ffn.py
    GET /api/presets, /api/gqa  15.5   api_gqa.py
    GET /api/token-tracer       15.6   api_trace.py (from llamablock.studies.trace)
    GET /v1/models, POST /v1/completions, POST /v1/chat/completions
                                an OpenAI-compatible API for one model   api_openai.py
    GET /metrics                the server's counters, Prometheus' text format   metrics.py

Static files go through Starlette's StaticFiles, which resolves each path and refuses any that
lands outside its directory, so `..` and encoded variants cannot read the rest of the disk.
"""

from __future__ import annotations

from contextlib import asynccontextmanager
from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.exception_handlers import http_exception_handler
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, JSONResponse, Response
from fastapi.staticfiles import StaticFiles
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.middleware.trustedhost import TrustedHostMiddleware

from llamablock.web import api_ffn, api_gqa, api_openai, api_rope, api_trace
from llamablock.web.errors import APIError, body, on_api_error, on_validation_error
from llamablock.web.generation import ServedModel
from llamablock.web.openai_requests import OpenAIError

STATIC = Path(__file__).parent / "static"


def create_app(trace_cache_dir: str | None = None, lab_results: str = "lab-out/results.json",
               served: ServedModel | None = None, hosts: list[str] | None = None) -> FastAPI:
    """`trace_cache_dir`: where the token tracer keeps its trained pair (None: the tracer's default).
    `lab_results`: the results.json of `llamablock lab`, for the measured decode times (optional).
    `served`: the model behind /v1 (None: /v1 lists no model); its worker stops with the app.
    `hosts`: the Host headers to answer (None: any). A server on 127.0.0.1 for a browser answers its
    own names only, so a web page elsewhere cannot reach it through DNS rebinding."""

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        yield
        if served is not None:
            served.worker.close()

    # No Swagger page: it loads its scripts from a CDN, and this application works offline.
    app = FastAPI(title="llamablock: the LLaMA block, interactive",
                  openapi_url="/api/openapi.json", docs_url=None, redoc_url=None, lifespan=lifespan)
    app.state.trace_cache_dir = trace_cache_dir
    app.state.lab_results = lab_results
    app.state.served = served
    if hosts is not None:
        app.add_middleware(TrustedHostMiddleware, allowed_hosts=hosts)
    app.add_exception_handler(APIError, on_api_error)
    app.add_exception_handler(RequestValidationError, on_validation_error)
    app.add_exception_handler(404, _not_found)
    for module in (api_rope, api_ffn, api_gqa, api_trace, api_openai):
        app.include_router(module.router)
    app.mount("/static", StaticFiles(directory=STATIC), name="static")

    @app.get("/", include_in_schema=False)
    def index() -> FileResponse:
        return FileResponse(STATIC / "index.html", headers={"Cache-Control": "no-cache"})

    @app.get("/metrics", include_in_schema=False)
    def metrics() -> Response:
        text = served.worker.metrics.text() if served is not None else b""
        return Response(text, media_type=CONTENT_TYPE_LATEST)

    @app.get("/api/{rest:path}", include_in_schema=False)
    def unknown_api(rest: str) -> JSONResponse:
        return JSONResponse(body(None, f"no such endpoint: /api/{rest[:60]}", "not found"), status_code=404)

    return app


async def _not_found(request: Request, exc) -> Response:
    """A path no route matches, in the shape of its API: the catch-all routes below cannot match
    every path (a path parameter does not match a newline)."""
    path = request.url.path
    if path.startswith("/v1/"):
        return OpenAIError(404, f"no such endpoint: {path[:60]}", None, "not_found").response()
    if path.startswith("/api/"):
        return JSONResponse(body(None, f"no such endpoint: {path[:60]}", "not found"), status_code=404)
    return await http_exception_handler(request, exc)

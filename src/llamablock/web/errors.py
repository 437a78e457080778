"""One JSON shape for every rejected request: {"error", "parameter", "message"}.

A 422 comes from FastAPI's own validation (type and range of each query parameter); a 400 is a
value that passes those checks but that the library rejects (say 32 query heads and 5 KV
heads). Either way the body names the parameter, so the page can point at the control.
"""

from __future__ import annotations

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse


class APIError(Exception):
    """A request the library cannot serve: HTTP `status` with a message naming `parameter`."""

    def __init__(self, parameter: str | None, message: str, status: int = 400, headers: dict | None = None):
        super().__init__(message)
        self.parameter, self.message, self.status, self.headers = parameter, message, status, headers


def body(parameter: str | None, message: str, error: str) -> dict:
    return {"error": error, "parameter": parameter, "message": message}


async def on_api_error(request: Request, exc: APIError) -> JSONResponse:
    return JSONResponse(body(exc.parameter, exc.message, "invalid parameter"), status_code=exc.status,
                        headers=exc.headers)


async def on_validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
    # FastAPI's errors carry loc = ("query", name); keep the first, and list them all.
    errors = exc.errors()
    first = errors[0] if errors else {}
    loc = first.get("loc", ())
    parameter = str(loc[-1]) if loc else None
    message = f"{parameter}: {first.get('msg', 'invalid value')}"
    if "input" in first and isinstance(first["input"], (str, int, float)):
        message += f" (got {str(first['input'])[:40]!r})"
    out = body(parameter, message, "invalid parameter")
    out["all"] = [{"parameter": str(e.get("loc", ("",))[-1]), "message": e.get("msg", "")} for e in errors]
    return JSONResponse(out, status_code=422)

"""Figure of module section 15.6 (`token-tracer-compare`), from llamablock.trace."""

from __future__ import annotations

import importlib
from fastapi import APIRouter

from llamablock.web.errors import APIError

router = APIRouter()


def _trace_module():
    """llamablock.trace, or a 503 naming why the figure cannot be computed."""
    try:
        trace = importlib.import_module("llamablock.trace")
    except ImportError as e:
        raise APIError(None, f"token-tracer-compare is not available: llamablock.trace cannot be imported ({e})", 503) from None
    return trace


def status() -> dict:
    try:
        _trace_module()
    except APIError as e:
        return {"available": False, "reason": e.message}
    return {"available": True, "reason": None}


@router.get("/api/token-tracer")
def token_tracer() -> dict:
    _trace_module()
    raise APIError(None, "token-tracer-compare is not available yet", 503)

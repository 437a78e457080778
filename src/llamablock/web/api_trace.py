"""Figure of module section 15.6 (`token-tracer-compare`), from llamablock.studies.trace.

`trace_pair(text, cache_dir)` runs the text through the trained 2017 and 2024 models and returns,
per stage, the residual stream's RMS, mean and variance for every token (and, for the post-LN
2017 model, the same after LayerNorm's division but before its learned scale). The pair is
trained on first use (85 s on an idle 2-core machine, measured once) and cached; a lock makes concurrent
first requests wait for one training instead of starting two. The endpoint is a plain `def`,
so FastAPI runs it in a worker thread and the other figures stay responsive meanwhile.
"""

from __future__ import annotations

import importlib
import threading

from fastapi import APIRouter, Query, Request

from llamablock.web.errors import APIError

router = APIRouter()

MAX_TEXT = 200  # characters; the pair is trained with 256 positions
_lock = threading.Lock()


def _trace_module():
    """llamablock.studies.trace, or a 503 naming why the figure cannot be computed."""
    try:
        trace = importlib.import_module("llamablock.studies.trace")
    except ImportError as e:
        raise APIError(None, f"token-tracer-compare is not available: llamablock.studies.trace cannot be imported ({e})", 503) from None
    return trace


def _trained(trace, cache_dir: str | None) -> bool:
    """Whether both models are already cached (so the first trace will not train)."""
    return all(trace.is_trained(run) for run in trace.pair_dirs(cache_dir).values())


def status(cache_dir: str | None = None) -> dict:
    try:
        trace = _trace_module()
    except APIError as e:
        return {"available": False, "reason": e.message}
    return {"available": True, "reason": None, "trained": _trained(trace, cache_dir),
            "first_use": f"the first trace trains both models ({trace.TRACE_RECIPE.steps} steps each, "
                         "about two minutes on two CPU cores) and caches them"}


@router.get("/api/token-tracer")
def token_tracer(
    request: Request,
    text: str = Query("ROMEO: But soft, what light", min_length=1, max_length=MAX_TEXT,
                      description=f"the input, 1 to {MAX_TEXT} characters of the Shakespeare corpus's alphabet"),
    top_k: int = Query(5, ge=1, le=20, description="predictions to list after the last character"),
) -> dict:
    trace = _trace_module()
    cache_dir = request.app.state.trace_cache_dir
    try:
        with _lock:
            result = trace.trace_pair(text, cache_dir=cache_dir, top_k=top_k)
    except ValueError as e:  # characters outside the corpus's alphabet, say
        raise APIError("text", f"text: {e}") from None
    models = []
    for arch, m in result["models"].items():
        models.append({"arch": arch, "preset": m["preset"], "params": m["params"], "steps": m["steps"],
                       "val_loss": m["val_loss"], "stages": m["stages"], "top": m["top"]})
    first = next(iter(result["models"].values()))
    n_blocks = sum(1 for s in first["stages"] if s["name"].endswith("after attention"))
    return {"text": text, "tokens": first["tokens"], "blocks": n_blocks, "models": models}

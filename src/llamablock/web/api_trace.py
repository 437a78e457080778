"""Figure of module section 15.6 (`token-tracer-compare`), from llamablock.studies.trace.

`trace_pair(text, cache_dir)` runs the text through the trained 2017 and 2024 models and returns,
per stage, the residual stream's RMS, mean and variance for every token (and, for the post-LN
2017 model, the same after LayerNorm's division but before its learned scale). The pair is
trained on first use (`TRACE_RECIPE`, which takes a while) and cached; a lock makes concurrent
first requests wait for one training instead of starting two. The endpoint is a plain `def`,
so FastAPI runs it in a worker thread and the other figures stay responsive meanwhile.
`train=false` never trains: with the pair not yet cached it answers 409, which the page uses on
load to trace at once when it can and otherwise to wait for a press of Trace.
"""

from __future__ import annotations

import threading

from fastapi import APIRouter, Query, Request

from llamablock.studies.trace import is_trained, pair_dirs, trace_pair
from llamablock.web.errors import APIError

router = APIRouter()

MAX_TEXT = 200  # characters; the pair is trained with 256 positions
_lock = threading.Lock()


@router.get("/api/token-tracer")
def token_tracer(
    request: Request,
    text: str = Query("ROMEO: But soft, what light", min_length=1, max_length=MAX_TEXT,
                      description=f"the input, 1 to {MAX_TEXT} characters of the Shakespeare corpus's alphabet"),
    top_k: int = Query(5, ge=1, le=20, description="predictions to list after the last character"),
    train: bool = Query(True, description="train the pair if it is not cached yet (false: answer 409 instead)"),
) -> dict:
    cache_dir = request.app.state.trace_cache_dir
    if not train and not all(is_trained(run) for run in pair_dirs(cache_dir).values()):
        raise APIError("train", "the tracer's models are not trained yet: the first trace trains both models, "
                       "which takes a while, and caches them", 409)
    try:
        with _lock:
            result = trace_pair(text, cache_dir=cache_dir, top_k=top_k)
    except ValueError as e:  # characters outside the corpus's alphabet, say
        raise APIError("text", f"text: {e}") from None
    models = []
    for arch, m in result["models"].items():
        models.append({"arch": arch, "preset": m["preset"], "params": m["params"], "steps": m["steps"],
                       "val_loss": m["val_loss"], "stages": m["stages"], "top": m["top"]})
    first = next(iter(result["models"].values()))
    n_blocks = sum(1 for s in first["stages"] if s["name"].endswith("after attention"))
    return {"text": text, "tokens": first["tokens"], "blocks": n_blocks, "models": models}

"""Figure of module section 15.6 (`token-tracer-compare`), from llamablock.studies.trace.

`trace_pair(text, cache_dir)` runs the text through the trained 2017 and 2024 models and returns,
per stage, the residual stream's RMS, mean and variance for every token (and, for the post-LN
2017 model, the same after LayerNorm's division but before its learned scale). The pair is
trained on first use (`TRACE_RECIPE`, which takes a while) and cached; a lock makes concurrent
first requests wait for one training instead of starting two. The endpoint is a plain `def`,
so FastAPI runs it in a worker thread and the other figures stay responsive meanwhile.
`train=false` never trains: with the pair not yet cached it answers 409, which the page uses on
load to trace at once when it can and otherwise to wait for a press of Trace.
The first-use training runs as one background job, never in the request's worker thread: a
request that finds the pair untrained starts the job (or finds it running) and gets 503 with
Retry-After at once, so a flood of first requests cannot hold the server's threads and the page
and figures keep answering. The text is checked against the corpus's alphabet before any work.
"""

from __future__ import annotations

import threading

from fastapi import APIRouter, Query, Request

from llamablock.studies.trace import ensure_pair, is_trained, pair_dirs, trace_pair
from llamablock.web.errors import APIError

router = APIRouter()

MAX_TEXT = 200  # characters; the pair is trained with 256 positions
RETRY_AFTER_S = 10  # what a 503 tells the client to wait while the pair trains
_lock = threading.Lock()  # one trace at a time (they share the loaded models' state)
_jobs: dict[str, threading.Thread] = {}  # cache dir -> the training in progress
_failed: dict[str, str] = {}  # cache dir -> why the last training failed
_jobs_lock = threading.Lock()  # requests arrive on many threads: one check-and-start at a time


def _train_in_background(cache_dir: str | None) -> None:
    key = str(cache_dir)
    with _jobs_lock:
        job = _jobs.get(key)
        if job is not None and job.is_alive():
            return
        _start(key, cache_dir)


def _start(key: str, cache_dir: str | None) -> None:
    def work():
        try:
            ensure_pair(cache_dir)
            _failed.pop(key, None)
        except Exception as e:  # reported to the next request instead of dying unseen
            _failed[key] = f"{type(e).__name__}: {e}"

    _jobs[key] = threading.Thread(target=work, name="tracer-training", daemon=True)
    _jobs[key].start()


def _check_alphabet(text: str) -> None:
    """The tracer's models read the corpus's characters only: refuse others before any work."""
    from llamablock.studies.trace import TRACE_RECIPE
    from llamablock.training.train import get_data

    alphabet = get_data(TRACE_RECIPE).tokenizer
    try:
        alphabet.encode(text)
    except ValueError as e:
        raise APIError("text", f"text: {e}") from None


@router.get("/api/token-tracer")
def token_tracer(
    request: Request,
    text: str = Query("ROMEO: But soft, what light", min_length=1, max_length=MAX_TEXT,
                      description=f"the input, 1 to {MAX_TEXT} characters of the Shakespeare corpus's alphabet"),
    top_k: int = Query(5, ge=1, le=20, description="predictions to list after the last character"),
    train: bool = Query(True, description="train the pair if it is not cached yet (false: answer 409 instead)"),
) -> dict:
    cache_dir = request.app.state.trace_cache_dir
    _check_alphabet(text)
    if not all(is_trained(run) for run in pair_dirs(cache_dir).values()):
        if not train:
            raise APIError("train", "the tracer's models are not trained yet: the first trace trains both models, "
                           "which takes a while, and caches them", 409)
        if str(cache_dir) in _failed and not (_jobs.get(str(cache_dir)) or threading.Thread()).is_alive():
            raise APIError(None, f"training the tracer's models failed: {_failed.pop(str(cache_dir))}", 500)
        _train_in_background(cache_dir)
        raise APIError(None, "training the tracer's two models (first use, cached afterwards); retry shortly", 503,
                       headers={"Retry-After": str(RETRY_AFTER_S)})
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

"""Which folder `llamablock train --out` may write: a new or empty one, or its own run.

A run folder holds the marker .llamablock-run (llamablock.util.files.RUN_MARKER) from its first
moment. Training without --resume claims a folder only when it is new, empty, or a run of ours
that has no checkpoint yet (one stopped before its first save): a finished or running run would
have its log rewritten and its checkpoints replaced, and a folder of the user's own files would
be written over. Resuming needs a run. Either refusal names the folder and what to do instead.
"""

from __future__ import annotations

from pathlib import Path

from llamablock.io.resolve import latest_checkpoint
from llamablock.util.files import RUN_MARKER, check_out_path, enclosing_run, is_run_dir


def _has_checkpoint(p: Path) -> bool:
    root = p / "checkpoints"
    return root.is_dir() and any(root.iterdir())


def claim_new_run(out) -> Path:
    """`out` (absolute, created, marked) for a new run; ValueError naming it when it is not ours."""
    p = check_out_path(out, "--out")
    run = enclosing_run(p.parent)
    if run is not None:
        raise ValueError(f"--out {out} is inside the training run or checkpoint {run}; choose a --out outside it")
    if p.exists() and not p.is_dir():
        raise ValueError(f"--out {out} is an existing file; choose a new folder")
    if p.is_dir() and is_run_dir(p) and _has_checkpoint(p):
        raise ValueError(f"--out {out} already holds a training run; continue it with `llamablock train --resume "
                         f"--out {out} --steps N`, or choose a new --out")
    if p.is_dir() and any(p.iterdir()) and not (p / RUN_MARKER).is_file():
        raise ValueError(f"--out {out} exists and holds files that are not a llamablock run; train writes only into "
                         "a new or empty folder: choose a new --out")
    p.mkdir(parents=True, exist_ok=True)
    (p / RUN_MARKER).write_text("a llamablock training run: checkpoints/, log.jsonl, export/\n")
    return p


def check_resume_dir(out) -> Path:
    """`out` (absolute) when it holds a run to resume; FileNotFoundError as latest_checkpoint says."""
    p = check_out_path(out, "--out")
    if not _has_checkpoint(p):
        latest_checkpoint(p)  # raises, saying what is missing and how to start
    return p

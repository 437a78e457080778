"""Helpers for the data-loss tests: a tiny finished training run made in seconds, a
listing of a folder's files with their contents' hashes (to show nothing was deleted or changed),
and a CLI call that must be refused in one line with exit status 2."""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

from llamablock import cli
from llamablock.presets import preset
from llamablock.training.train import TrainConfig, train

TINY = dict(d_model=32, n_layers=1, n_heads=4, n_kv_heads=2, d_ff=64, max_seq_len=16)
RECIPE = TrainConfig(steps=4, batch_size=2, context=16, warmup=1, eval_every=2, eval_windows=2)
# The same run as `llamablock train` flags (TINY and RECIPE, without --steps).
FLAGS = ["--arch", "2024", *[x for k, v in TINY.items() for x in ("--set", f"{k}={v}")], "--batch-size", "2",
         "--context", "16", "--warmup", "1", "--eval-every", "2", "--eval-windows", "2", "--no-progress"]


def make_run(out: Path, steps: int = 4) -> Path:
    """A finished run of `steps` steps (checkpoints at every second step) in `out`."""
    train(preset("llama-2024-small", **TINY), TrainConfig(**{**RECIPE.__dict__, "steps": steps}), out, progress=False)
    return out


def copy_run(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns(".lock"))
    return dst


def listing(root: Path) -> dict[str, str]:
    """relative path -> sha256 of every file under `root` (a folder maps to 'dir')."""
    out = {}
    for p in sorted(Path(root).rglob("*")):
        if p.name == ".lock":
            continue  # flock's file: its presence is not data
        out[str(p.relative_to(root))] = "dir" if p.is_dir() else hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def refused(capsys, argv: list[str]) -> str:
    """The one-line error of a command that must exit with status 2."""
    code = cli.main(argv)
    out, err = capsys.readouterr()
    assert code == 2, (code, out, err)
    assert err.count("\n") == 1 and "Traceback" not in err, err
    return err

"""A compile killed before its package was renamed into place leaves its staging folder `.<key>.<pid>`
(weights and all): the next process that loads or compiles a package removes those of processes
that are gone, and leaves those of compiles still running (fast/compiled/package_check.py)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from llamablock.config import ModelConfig
from llamablock.fast.compiled import aoti_step, package_check
from llamablock.fast.compiled.static_decode import StaticDecoder
from llamablock.model import Decoder

KEY = "0123456789abcdef0123456789abcdef"


def dead_pid() -> int:
    """The pid of a process that has exited."""
    done = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    return int(done.stdout)


def leftovers(packages):
    """A killed compile's folder, a running one's (this process), a whole package, a half-written index."""
    dead = dead_pid()
    folders = {"killed": packages / f".{KEY}.{dead}", "running": packages / f".{KEY[::-1]}.{os.getpid()}",
               "package": packages / KEY}
    for folder in folders.values():
        (folder / "package" / "data").mkdir(parents=True)
        (folder / "package" / "data" / "weights").write_bytes(b"w" * 100)
    folders["index"] = packages / f".builds.json.{dead}.tmp"
    folders["index"].write_text("{")
    return folders


def test_stale_staging_of_dead_processes_is_removed_and_live_kept(tmp_path):
    f = leftovers(tmp_path)
    assert sorted(package_check.staging(tmp_path)) == sorted([(f["killed"], False), (f["running"], True),
                                                              (f["index"], False)])
    assert sorted(package_check.remove_stale_staging(tmp_path)) == sorted([f["killed"], f["index"]])
    assert not f["killed"].exists() and not f["index"].exists()
    assert f["running"].is_dir() and f["package"].is_dir()


@pytest.fixture
def static():
    cfg = ModelConfig(vocab_size=64, d_model=32, n_layers=1, n_heads=2, max_seq_len=64)
    torch.manual_seed(0)
    return StaticDecoder(Decoder(cfg).eval(), 64)


def test_the_next_use_of_the_package_cache_removes_them(tmp_path, monkeypatch, static):
    """A program whose settings failed before (its marker: nothing is compiled here) still clears a
    killed compile's folder on its way."""
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    example = (torch.zeros(1, 1, dtype=torch.long), torch.zeros(1, dtype=torch.long))
    path = aoti_step.package_dir() / aoti_step.package_key(static, "float32", {}, "step", example, "w")
    path.parent.mkdir(parents=True)
    aoti_step.failure_marker(path).write_text("failed before\n")
    f = leftovers(path.parent)
    with pytest.raises(aoti_step.BuildFailed):
        aoti_step.AOTIProgram(static, "float32", {}, "step", example, "w")
    assert not f["killed"].exists() and f["running"].is_dir() and f["package"].is_dir()

"""llamablock.util.files' replacement of folders it owns: the swap without renameat2,
the cleanup of a killed writer's leftovers (only those marked as ours), and what counts as a run."""

from __future__ import annotations

import os

import pytest

from llamablock.util import files as F

DEAD = 2**22 + 12345  # above Linux's largest pid: no such process


def _folder(path, marker, text):
    path.mkdir()
    (path / marker).write_text("")
    (path / "a.txt").write_text(text)
    return path


def test_replace_without_the_atomic_swap_keeps_a_whole_folder(tmp_path, monkeypatch):
    monkeypatch.setattr(F, "_exchange", lambda a, b: False)
    out = _folder(tmp_path / "out", F.EXPORT_MARKER, "old")
    new = _folder(tmp_path / ".new", F.EXPORT_MARKER, "new")
    F.replace_dir(new, out, F.EXPORT_MARKER)
    assert (out / "a.txt").read_text() == "new" and sorted(os.listdir(tmp_path)) == ["out"]


def test_the_swap_removes_the_old_folder(tmp_path):
    out = _folder(tmp_path / "out", F.EXPORT_MARKER, "old")
    F.replace_dir(_folder(tmp_path / ".new", F.EXPORT_MARKER, "new"), out, F.EXPORT_MARKER)
    assert (out / "a.txt").read_text() == "new" and sorted(os.listdir(tmp_path)) == ["out"]


def test_stale_leftovers_of_ours_are_removed_and_nothing_else(tmp_path):
    out = tmp_path / "out"
    ours = _folder(tmp_path / f".out.llamablock-tmp-{DEAD}", F.EXPORT_MARKER, "half")
    empty = tmp_path / f".out.llamablock-tmp-old-{DEAD + 1}"
    empty.mkdir()  # killed between mkdir and the marker
    half_gguf = tmp_path / f".out.{DEAD}.tmp"
    half_gguf.write_bytes(b"GGUF")
    unmarked = tmp_path / f".out.llamablock-tmp-{DEAD + 2}"
    unmarked.mkdir()
    (unmarked / "precious.txt").write_text("not ours: no marker")
    live = _folder(tmp_path / f".out.llamablock-tmp-{os.getpid()}", F.EXPORT_MARKER, "being written")
    F.clean_stale(out, F.EXPORT_MARKER)
    assert not ours.exists() and not empty.exists() and not half_gguf.exists()
    assert (unmarked / "precious.txt").exists() and live.exists()


def test_a_checkpoints_folder_of_another_tool_is_not_a_run(tmp_path):
    (tmp_path / "checkpoints").mkdir()
    assert F.enclosing_run(tmp_path / "exports" / "m") is None
    (tmp_path / "checkpoints" / "latest").write_text("step-000002")
    assert F.enclosing_run(tmp_path / "exports" / "m") == tmp_path


@pytest.mark.parametrize("out", ["", "  "])
def test_an_empty_out_is_refused(out):
    with pytest.raises(ValueError, match="is empty"):
        F.check_out_path(out)

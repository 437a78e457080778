"""`llamablock export RUN OUT` writes only a new path or an earlier export.

Each case was a data loss: OUT an existing folder of the user's, the folder that holds the run,
RUN/checkpoints, the run's latest checkpoint, `..` from inside the run, `.`, a foreign file where
the .gguf goes. Each is now refused in one line naming OUT, exit status 2, and the test lists the
files before and after to show nothing was deleted or changed.
"""

from __future__ import annotations

import os

import pytest
from tiny_run import copy_run, listing, make_run, refused

from llamablock import cli


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    return make_run(tmp_path_factory.mktemp("made") / "run")


@pytest.fixture
def home(made, tmp_path):
    """tmp_path/run: a fresh copy of a finished tiny run; tmp_path holds nothing else."""
    copy_run(made, tmp_path / "run")
    return tmp_path


def _refused_keeping(capsys, home, argv, *names):
    before = listing(home)
    err = refused(capsys, ["export", *argv])
    assert listing(home) == before
    for n in names:
        assert n in err, err
    return err


def test_an_existing_folder_of_the_users_is_refused(home, capsys):
    mine = home / "mine"
    mine.mkdir()
    (mine / "thesis.tex").write_text("years of work")
    _refused_keeping(capsys, home, [str(home / "run"), str(mine)], str(mine), "did not write")


def test_the_folder_that_holds_the_run_is_refused(home, capsys):
    _refused_keeping(capsys, home, [str(home / "run"), str(home)], str(home))


@pytest.mark.parametrize("inside", ["run", "run/checkpoints", "run/checkpoints/step-000004", "run/export"])
def test_a_path_in_the_run_is_refused(home, capsys, inside):
    err = _refused_keeping(capsys, home, [str(home / "run"), str(home / inside)], "training run")
    assert "outside" in err


def test_dot_dot_from_inside_the_run_is_refused(home, capsys, monkeypatch):
    monkeypatch.chdir(home / "run")
    _refused_keeping(capsys, home, [".", ".."], "..")


def test_dot_in_a_folder_of_the_users_is_refused_by_name(home, capsys, monkeypatch):
    mine = home / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep")
    monkeypatch.chdir(mine)
    err = _refused_keeping(capsys, home, [str(home / "run"), "."], "did not write")
    assert "empty name" not in err


def test_a_foreign_file_is_not_overwritten_by_a_gguf_export(home, capsys):
    (home / "model.gguf").write_bytes(b"GGUF" + b"\0" * 60)  # someone else's (or a torn) GGUF
    _refused_keeping(capsys, home, [str(home / "run"), str(home / "model.gguf"), "--format", "gguf"],
                     "model.gguf", "not a GGUF file llamablock exported")


def test_an_existing_file_is_not_replaced_by_a_folder_export(home, capsys):
    (home / "notes").write_text("keep")
    _refused_keeping(capsys, home, [str(home / "run"), str(home / "notes")], "not a folder")


def test_an_earlier_export_is_replaced(home, capsys):
    for fmt, out in (("hf", home / "e"), ("gguf", home / "e.gguf")):
        assert cli.main(["export", str(home / "run"), str(out), "--format", fmt]) == 0
        assert cli.main(["export", str(home / "run"), str(out), "--format", fmt]) == 0  # ours: replaced
    capsys.readouterr()
    assert not [p for p in os.listdir(home) if p.startswith(".")]  # no staging folder or file left

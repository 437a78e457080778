"""`llamablock train --out` writes only a new or empty folder, or (with --resume) its own run, and
refuses flags that would allocate without bound. Every refusal is one line, exit
status 2, naming the folder or flag; the listings before and after show nothing was touched."""

from __future__ import annotations

import pytest
from tiny_run import FLAGS, listing, refused

from llamablock import cli
from llamablock.training import checkpoint as ckpt


def test_a_finished_run_is_not_overwritten_without_resume(run, capsys):
    before = listing(run)
    err = refused(capsys, ["train", *FLAGS, "--steps", "4", "--out", str(run)])
    assert "already holds a training run" in err and "--resume" in err and listing(run) == before


def test_a_folder_of_the_users_is_not_written(tmp_path, capsys):
    (tmp_path / "essay.txt").write_text("mine")
    (tmp_path / "log.jsonl").write_text("my own log\n")
    before = listing(tmp_path)
    err = refused(capsys, ["train", *FLAGS, "--steps", "2", "--out", str(tmp_path)])
    assert "not a llamablock run" in err and str(tmp_path) in err and listing(tmp_path) == before


def test_a_folder_inside_a_run_is_refused(run, capsys):
    before = listing(run)
    err = refused(capsys, ["train", *FLAGS, "--steps", "2", "--out", str(run / "checkpoints" / "new")])
    assert "inside the training run" in err and listing(run) == before


@pytest.mark.parametrize("flags, named", [
    (["--steps", "0"], "--steps"),
    (["--out", ""], "--out is empty"),
    (["--batch-size", str(10**9)], "--batch-size 1000000000"),
    (["--set", "n_layers=200000"], "n_layers=200000"),
    (["--tokenizer", "bpe", "--bpe-vocab", "1"], "bpe_vocab"),
    (["--tokenizer", "bpe", "--bpe-vocab", str(10**8)], "bpe_vocab"),
])
def test_unbounded_or_empty_flags_are_refused_by_name(tmp_path, capsys, flags, named):
    out = ["--out", str(tmp_path / "r")] if "--out" not in flags else []
    err = refused(capsys, ["train", *FLAGS, "--steps", "2", *out, *flags])
    assert named in err, err
    assert not (tmp_path / "r").exists()  # refused before the folder was made


def test_the_first_runs_command_with_more_steps_resumes(run, capsys):
    """The habit: repeat the first command with more --steps and --resume."""
    assert cli.main(["train", *FLAGS, "--steps", "6", "--out", str(run), "--resume"]) == 0
    assert "to step 6" in capsys.readouterr().out


def test_a_changed_model_flag_on_resume_is_refused_by_name(run, capsys):
    before = listing(run)
    err = refused(capsys, ["train", *FLAGS, "--set", "d_ff=128", "--steps", "6", "--out", str(run), "--resume"])
    assert "--set d_ff=128 (this run: 64)" in err and listing(run) == before
    err = refused(capsys, ["train", "--arch", "2017", "--steps", "6", "--out", str(run), "--resume", "--no-progress"])
    assert "--set position=learned (this run: rope)" in err


def test_a_second_resume_of_a_run_being_trained_names_the_lock(run, capsys):
    with ckpt.run_lock(run):
        err = refused(capsys, ["train", "--resume", "--out", str(run), "--steps", "6", "--no-progress"])
    assert "another llamablock train is writing to" in err


def test_a_run_stopped_before_its_first_checkpoint_may_be_started_again(tmp_path, capsys):
    out = tmp_path / "r"
    out.mkdir()
    (out / ".llamablock-run").write_text("")
    (out / "log.jsonl").write_text("")
    assert cli.main(["train", *FLAGS, "--steps", "2", "--out", str(out)]) == 0


def test_a_fifo_as_the_runs_lock_is_refused_not_waited_on(run, capsys):
    """`RUN/.lock` a FIFO: opening it to write waited for a reader for ever; now one line naming it."""
    import os
    import threading

    lock = run / ".lock"
    lock.unlink(missing_ok=True)
    os.mkfifo(lock)
    result = {}
    t = threading.Thread(target=lambda: result.update(err=refused(
        capsys, ["train", "--resume", "--out", str(run), "--steps", "6", "--no-progress"])), daemon=True)
    t.start()
    t.join(30)
    if t.is_alive():  # let the blocked open return, then fail
        os.close(os.open(lock, os.O_RDONLY | os.O_NONBLOCK))
        pytest.fail("train --resume waited on a FIFO planted as the run's lock")
    assert ".lock is a FIFO (named pipe), not the run's lock file" in result["err"]

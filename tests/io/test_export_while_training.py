"""`llamablock export` of a run that is still training (issue 43: "step-000073/model.safetensors
is missing", 4 exports in 6).

Training deletes all but its newest two checkpoints after each save, so the checkpoint an export
resolved could vanish before it was read. The export now reads under the run's readers lock
(io/llamablock_dir.checkpoint_readers) and training deletes only when no reader holds it. The
race is made certain here: the export's read of the checkpoint first lets "training" save two
more checkpoints (training.checkpoint.save_checkpoint, which prunes), which without the lock
deleted the very folder being exported. A real training process beside repeated exports is the
last test. When `latest` names no complete checkpoint while a trainer holds the run, one line
says so and names the newest complete checkpoint.
"""

from __future__ import annotations

import subprocess
import sys
import time

import torch
from tiny_run import FLAGS, make_run, refused

from llamablock import cli
from llamablock.io import llamablock_dir
from llamablock.io.export import export_run
from llamablock.io.llamablock_dir import load_checkpoint as real_load
from llamablock.io.resolve import latest_checkpoint
from llamablock.training.checkpoint import run_lock, save_checkpoint


def _save(run, step: int) -> None:
    """What training does at a save: a new checkpoint, then the pruning of all but the newest two."""
    model, _, state = real_load(latest_checkpoint(run))
    state = {k: v for k, v in state.items() if k not in ("step", "optimizer", "sha256")}
    save_checkpoint(run, step, model, torch.optim.AdamW(model.parameters()), state)


def _steps(run) -> list[str]:
    return sorted(p.name for p in (run / "checkpoints").glob("step-*"))


def _training_meanwhile(monkeypatch, module, run):
    """Make `module.load_checkpoint` let training save twice (pruning) before it reads."""
    def load(path, verify=False):
        _save(run, 6)
        _save(run, 8)
        return real_load(path, verify)

    monkeypatch.setattr(module, "load_checkpoint", load)


def test_the_command_exports_the_checkpoint_it_resolved_while_training_saves(tmp_path, monkeypatch, capsys):
    run = make_run(tmp_path / "run", steps=4)  # checkpoints at steps 2 and 4
    _training_meanwhile(monkeypatch, llamablock_dir, run)
    assert cli.main(["export", str(run), str(tmp_path / "out")]) == 0
    assert f"from {run / 'checkpoints' / 'step-000004'}" in capsys.readouterr().out
    assert _steps(run) == ["step-000002", "step-000004", "step-000006", "step-000008"]  # kept while read
    _save(run, 10)  # no reader now: the next save prunes what the reader held
    assert _steps(run) == ["step-000008", "step-000010"]


def test_export_run_reads_under_the_lock_too(tmp_path, monkeypatch):
    import llamablock.io.export as export

    run = make_run(tmp_path / "run", steps=4)
    _training_meanwhile(monkeypatch, export, run)
    fmt, out = export_run(run, tmp_path / "out")
    assert fmt == "hf" and (out / "model.safetensors").is_file()


def test_while_training_holds_the_run_an_incomplete_latest_names_the_complete_one(tmp_path, capsys):
    run = make_run(tmp_path / "run", steps=4)
    new = run / "checkpoints" / "step-000006"  # as a checkpoint being deleted or copied in leaves it
    new.mkdir()
    (new / "state.json").write_text((run / "checkpoints" / "step-000004" / "state.json").read_text())
    (run / "checkpoints" / "latest").write_text("step-000006")
    with run_lock(run):
        err = refused(capsys, ["export", str(run), str(tmp_path / "out")])
    assert "training is writing to" in err and "step-000004" in err and "wait for training to end" in err
    err = refused(capsys, ["export", str(run), str(tmp_path / "out")])  # no trainer: the pointer's own message
    assert "training is writing" not in err and "incomplete or missing" in err


def test_exports_beside_a_real_training_all_succeed(tmp_path):
    """`llamablock train` in another process saving at every step; exports one after another until
    it ends: every one is written (a hang guard bounds the wait; nothing is timed)."""
    run = tmp_path / "run"
    cmd = [sys.executable, "-m", "llamablock", "train", *FLAGS, "--out", str(run), "--steps", "120",
           "--eval-every", "1", "--eval-windows", "1"]  # the last --eval-* given wins
    trainer = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    done, end = 0, time.monotonic() + 300
    try:
        while not (run / "checkpoints" / "latest").exists():
            assert trainer.poll() is None and time.monotonic() < end, "no checkpoint came"
            time.sleep(0.05)
        while trainer.poll() is None or done == 0:
            out = tmp_path / f"out{done % 2}"
            assert cli.main(["export", str(run), str(out), "--format", "llamablock"]) == 0
            done += 1
    finally:
        trainer.kill() if trainer.poll() is None else None
        _, err = trainer.communicate(timeout=60)
    assert trainer.returncode == 0, err
    assert done >= 2

"""A checkpoint's state.json is checked before anything trusts it (io/checkpoint_state.py; a resume
also checks its training settings, training/state_check.py).

Regression cases from the probe: a checksum table naming a file outside the checkpoint made resume
open and hash it; a checkpoint without checksums was resumed and exported with changed weights; a
list for sha256 was a traceback; a claim of a million layers or a width of 200,000 built the model
first (MemoryError); a negative or mismatched step was accepted; a NaN in the history reached
log.jsonl. Then hypothesis edits any field to any JSON value: refused cleanly or accepted, never
a traceback and never a large allocation.
"""

from __future__ import annotations

import json
import resource
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from tiny_run import listing, refused

from llamablock.io import checkpoint_state
from llamablock.io.llamablock_dir import load_checkpoint
from llamablock.training import checkpoint as ckpt
from llamablock.training.train import train


def _edit(folder, change):
    path = folder / "state.json"
    state = json.loads(path.read_text())
    change(state)
    path.write_text(json.dumps(state))


def _every_checkpoint(run, change):
    for p in (run / "checkpoints").glob("step-*"):
        _edit(p, change)


def _export_refused(capsys, run, tmp_path, *names):
    err = refused(capsys, ["export", str(run), str(tmp_path / "out")])
    assert not (tmp_path / "out").exists()
    for n in names:
        assert n in err, err
    return err


def test_a_checksum_table_naming_a_file_outside_is_refused_unopened(run, tmp_path, capsys, monkeypatch):
    secret = tmp_path / "secret.bin"
    secret.write_bytes(b"not the checkpoint's")
    hashed = []
    real = checkpoint_state.sha256
    monkeypatch.setattr(checkpoint_state, "sha256", lambda p: hashed.append(p) or real(p))
    _every_checkpoint(run, lambda s: s["sha256"].update({"../../../secret.bin": "0" * 64}))
    err = refused(capsys, ["train", "--resume", "--out", str(run), "--steps", "6", "--no-progress"])
    assert "sha256 must name exactly" in err
    _export_refused(capsys, run, tmp_path, "sha256 must name exactly")
    assert not any(Path(p).resolve() == secret.resolve() for p in hashed)  # refused by name, never opened


def test_a_checkpoint_without_checksums_is_refused_by_resume_and_export(run, tmp_path, capsys):
    _every_checkpoint(run, lambda s: s.pop("sha256"))
    before = listing(run)
    err = refused(capsys, ["train", "--resume", "--out", str(run), "--steps", "6", "--no-progress"])
    assert "sha256 is missing: this checkpoint has no checksums" in err and listing(run) == before
    _export_refused(capsys, run, tmp_path, "no checksums")


def test_export_refuses_weights_that_no_longer_match_their_checksum(run, tmp_path, capsys):
    weights = ckpt.latest_checkpoint(run) / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-3] ^= 0x10
    weights.write_bytes(bytes(data))
    _export_refused(capsys, run, tmp_path, "model.safetensors does not match the checksum")


@pytest.mark.parametrize("value", [["0" * 64], 7, {"model.safetensors": 5, "optimizer.safetensors": "x"}])
def test_a_mistyped_sha256_is_one_line(run, tmp_path, capsys, value):
    _every_checkpoint(run, lambda s: s.update(sha256=value))
    _export_refused(capsys, run, tmp_path, "sha256")


@pytest.mark.parametrize("field, value, named", [("n_layers", 1_000_000, "n_layers is 1000000"),
                                                 ("d_model", 200_000, "model_config implies"),
                                                 ("vocab_size", 10**9, "model_config implies")])
def test_a_huge_model_claim_is_refused_before_any_model_is_built(run, tmp_path, capsys, field, value, named):
    _every_checkpoint(run, lambda s: s["model_config"].update({field: value}))
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    _export_refused(capsys, run, tmp_path, named)
    err = refused(capsys, ["train", "--resume", "--out", str(run), "--steps", "6", "--no-progress"])
    assert named in err
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - peak < 200_000  # KiB: nothing large allocated


@pytest.mark.parametrize("step, named", [(-4, "step must be a whole number >= 0"), (3, "but the folder is step-000004"),
                                         ("4", "step must be a whole number")])
def test_a_bad_step_is_refused(run, tmp_path, capsys, step, named):
    _edit(ckpt.latest_checkpoint(run), lambda s: s.update(step=step))
    _export_refused(capsys, run, tmp_path, named)
    assert named in ckpt.verify(ckpt.latest_checkpoint(run))


def test_a_nan_in_the_history_never_reaches_the_log(run, capsys):
    _every_checkpoint(run, lambda s: s["history"][0].update(train_loss=float("nan")))
    log = (run / "log.jsonl").read_text()
    with pytest.raises(FileNotFoundError, match=r"history\[0\] is not a record of finite"):
        train(None, None, run, resume=True, progress=False, steps=6)
    assert (run / "log.jsonl").read_text() == log and "NaN" not in log


JSON = st.recursive(st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats() | st.text(max_size=8),
                    lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=8), c, max_size=3),
                    max_leaves=6)
FIELDS = [("step",), ("sha256",), ("sha256", "model.safetensors"), ("sha256", "../state.json"),
          ("sha256", "/etc/passwd"), ("model_config",), ("model_config", "n_layers"), ("model_config", "d_model"),
          ("model_config", "n_heads"), ("model_config", "d_ff"), ("model_config", "vocab_size"),
          ("model_config", "max_seq_len"), ("model_config", "head_dim"), ("train_config", "steps"),
          ("train_config", "bpe_vocab"), ("tokenizer",), ("tokenizer", "chars"), ("history",),
          ("optimizer", "param_groups"), ("model_config", "tie_embeddings")]


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(edits=st.lists(st.tuples(st.sampled_from(FIELDS), JSON), min_size=1, max_size=3))
@example(edits=[(("sha256",), 5)])  # the probe's cases, always tried
@example(edits=[(("sha256",), ["0" * 64])])
@example(edits=[(("step",), -4)])
@example(edits=[(("model_config", "n_layers"), 10**6)])
@example(edits=[(("sha256", "../state.json"), "0" * 64)])
def test_any_edit_of_state_json_is_refused_cleanly_or_accepted(made, tmp_path_factory, edits):
    folder = tmp_path_factory.mktemp("ck") / "step-000004"
    import shutil

    shutil.copytree(ckpt.latest_checkpoint(made), folder)

    def change(state):
        for keys, value in edits:
            node = state
            for k in keys[:-1]:
                node = node.setdefault(k, {}) if isinstance(node, dict) else {}
            if isinstance(node, dict):
                node[keys[-1]] = value

    _edit(folder, change)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    try:
        load_checkpoint(folder, verify=True)
    except ValueError as e:
        assert str(folder / "state.json") in str(e) or str(folder) in str(e)
    assert ckpt.verify(folder) is None or isinstance(ckpt.verify(folder), str)
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - peak < 200_000  # KiB


def test_a_run_saved_before_checksums_is_still_read_for_generation(run):
    """Checksums are required to resume or export, not to generate: load_checkpoint without verify."""
    _every_checkpoint(run, lambda s: s.pop("sha256"))
    model, _, state = load_checkpoint(ckpt.latest_checkpoint(run))
    assert state["step"] == 4 and model.cfg.n_layers == 1
    with pytest.raises(ValueError, match="sha256 is missing"):
        load_checkpoint(ckpt.latest_checkpoint(run), verify=True)

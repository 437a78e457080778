"""Regression tests for runs that resumed from damaged checkpoints, trained on past their end,
silently ignored changed flags or were written by two trainers at once: each is now refused with
a message naming the problem, or falls back to the newest good checkpoint, saying so."""

from __future__ import annotations

import json

import pytest
from safetensors.torch import load_file, save_file

from llamablock import cli
from llamablock.presets import preset
from llamablock.training import checkpoint as ckpt
from llamablock.training.train import TrainConfig, train

TINY = dict(d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=64, max_seq_len=32)
RECIPE = TrainConfig(steps=20, batch_size=4, context=16, warmup=2, eval_every=10, eval_windows=4)


@pytest.fixture
def run(tmp_path):
    train(preset("llama-2024-small", **TINY), RECIPE, tmp_path, progress=False)
    return tmp_path  # checkpoints step-000010 and step-000020


def _latest(run):
    return ckpt.latest_checkpoint(run)


def test_a_checkpoint_with_nan_weights_is_skipped_for_the_previous_one(run, capsys):
    path = _latest(run) / "model.safetensors"
    tensors = load_file(str(path))
    first = sorted(tensors)[0]
    tensors[first][0] = float("nan")
    save_file(tensors, str(path))
    assert "non-finite" in ckpt.verify(_latest(run)) or "checksum" in ckpt.verify(_latest(run))
    result = train(None, None, run, resume=True, progress=False, steps=25)
    assert result["step"] == 25 and "resuming from step-000010 instead" in capsys.readouterr().err


def test_a_checkpoint_with_flipped_bytes_fails_its_checksum(run):
    path = _latest(run) / "optimizer.safetensors"
    data = bytearray(path.read_bytes())
    data[-5] ^= 0xFF
    path.write_bytes(bytes(data))
    assert "does not match the checksum" in ckpt.verify(_latest(run))
    assert ckpt.newest_good_checkpoint(run).name == "step-000010"


def test_no_good_checkpoint_is_one_clear_error(run):
    for p in (run / "checkpoints").glob("step-*"):
        (p / "model.safetensors").write_bytes(b"torn")
    with pytest.raises(FileNotFoundError, match="no usable checkpoint"):
        train(None, None, run, resume=True, progress=False, steps=30)


def test_resuming_a_finished_run_says_it_is_finished(run, capsys):
    assert cli.main(["train", "--resume", "--out", str(run), "--no-progress"]) == 2
    assert "is finished: it reached step 20 of 20" in capsys.readouterr().err


def test_changed_flags_on_resume_are_refused_by_name(run, capsys):
    assert cli.main(["train", "--resume", "--out", str(run), "--steps", "30", "--lr", "5", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "--lr 5.0 (this run: 0.001)" in err and err.count("\n") == 1


def test_a_second_trainer_on_the_same_directory_is_refused(run):
    with ckpt.run_lock(run):
        with pytest.raises(ValueError, match="another llamablock train is writing to"):
            train(None, None, run, resume=True, progress=False, steps=25)


def test_a_diverging_run_stops_before_writing_nan(tmp_path):
    hot = TrainConfig(steps=20, batch_size=4, context=16, warmup=0, eval_every=10, eval_windows=4, lr=1e6, grad_clip=1e9)
    with pytest.raises(ValueError, match="training diverged at step"):
        train(preset("llama-2024-small", **TINY), hot, tmp_path, progress=False)
    for line in (tmp_path / "log.jsonl").read_text().splitlines():
        json.loads(line)  # valid JSON: no NaN was written


def test_checkpoints_record_checksums(run):
    sums = ckpt.read_state(_latest(run))["sha256"]
    assert set(sums) == {"model.safetensors", "optimizer.safetensors"} and ckpt.verify(_latest(run)) is None


def test_an_out_that_cannot_be_written_is_one_line(capsys):
    """/sys refuses new folders even to root (CI runs as root, where chmod would not stop it)."""
    code = cli.main(["train", "--arch", "2024", "--steps", "2", "--out", "/sys/llamablock-run", "--no-progress"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "Operation not permitted" in err


def test_a_failed_checkpoint_write_leaves_no_temporary_folder(run, monkeypatch):
    """A full disk while the tensors are written (simulated; tests/training/test_full_disk.py fills
    one for real): one error naming the file, and neither a
    .tmp folder nor a broken checkpoint is left; `latest` still names the last good one."""
    import torch

    from llamablock.model import Decoder

    def full(*args, **kw):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(ckpt, "save_file", full)
    model = Decoder(preset("llama-2024-small", **TINY))
    opt = torch.optim.AdamW(model.parameters())
    with pytest.raises(ValueError, match="no space left on device: .*step-000030/optimizer.safetensors"):
        ckpt.save_checkpoint(run, 30, model, opt, {"history": []})
    assert not list((run / "checkpoints").glob(".tmp-*")) and _latest(run).name == "step-000020"


def test_an_edited_state_json_is_caught(run):
    path = _latest(run) / "state.json"
    state = json.loads(path.read_text())
    del state["train_config"]
    path.write_text(json.dumps(state))
    assert "train_config is missing or not a JSON object" in ckpt.verify(_latest(run))
    assert ckpt.newest_good_checkpoint(run).name == "step-000010"


def test_a_kv_cache_the_machine_cannot_allocate_is_one_clear_error(monkeypatch):
    import torch

    from llamablock.kv_cache import KVCache
    from llamablock.model import Decoder
    from llamablock.runtime.engine import EagerEngine

    def refuse(self, max_len):
        raise RuntimeError("DefaultCPUAllocator: can't allocate memory")

    monkeypatch.setattr(KVCache, "grow", refuse)
    engine = EagerEngine(Decoder(preset("llama-2024-small", **TINY)).eval())
    engine.prepare(10_000)
    with torch.no_grad(), pytest.raises(ValueError, match="the KV cache for .* tokens needs .* GiB"):
        engine.prefill(torch.zeros(1, 300, dtype=torch.long))


@pytest.mark.parametrize("damage", [
    lambda old: {"kind": "bpe", "tokenizer": {"model": {"type": "nonsense"}}},  # valid JSON, not a tokenizer
    lambda old: {"kind": "bpe", "tokenizer": {"version": "1.0", "model": {"type": "BPE", "vocab": [1], "merges": 7}}},
    lambda old: {"kind": "char", "chars": old["chars"] + old["chars"][0]},  # one character listed twice
    lambda old: {"kind": "char", "chars": old["chars"][::-1]},  # not in sorted order: other ids
], ids=["bpe-wrong-shape", "bpe-unparsable", "char-repeated", "char-unsorted"])
def test_a_damaged_tokenizer_record_is_one_line(run, capsys, damage):
    """A BPE record in its envelope whose tokenizer.json the tokenizers library cannot parse, or a
    character record that lists a character twice (its ids would shift): the checks before a resume
    read the record as the resume will, so the resume is refused in one line naming state.json,
    instead of the library's bare Exception or a run silently continued with other ids."""
    for p in (run / "checkpoints").glob("step-*"):
        state = json.loads((p / "state.json").read_text())
        state["tokenizer"] = damage(state["tokenizer"])
        (p / "state.json").write_text(json.dumps(state))
    assert cli.main(["train", "--resume", "--out", str(run), "--steps", "30", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "step-000020/state.json: tokenizer: the run's tokenizer record is damaged" in err

"""Training: loss goes down, resume is exact, a killed checkpoint writer leaves the last one loadable."""

import json
import shutil

import pytest
import torch

from llamablock.presets import preset
from llamablock.training import checkpoint as train_state
from llamablock.training.train import TrainConfig, load_trained, lr_at, train

# A tiny 2024-style model (the architecture does not matter to these properties).
TINY = dict(d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=64, max_seq_len=32)
TC = TrainConfig(steps=30, batch_size=8, context=32, lr=3e-3, warmup=5, eval_every=15, eval_windows=16, seed=3)


def _vals(history):
    return [r["val_loss"] for r in history if "val_loss" in r]


@pytest.fixture(scope="module")
def full_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("full")
    return out, train(preset("llama-2024-small", **TINY), TC, out, progress=False)


@pytest.mark.slow
def test_thirty_steps_decrease_validation_loss(full_run):
    out, result = full_run
    first, last = _vals(result["history"])
    assert last < first - 0.1, (first, last)
    # Logs and curves exist; every step logged once.
    lines = [json.loads(x) for x in (out / "log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in lines] == list(range(1, 31))
    assert (out / "curves.png").stat().st_size > 1000


def test_lr_schedule_warmup_then_cosine():
    t = TrainConfig(steps=100, lr=1.0, warmup=10, min_lr_ratio=0.1)
    assert lr_at(0, t) == pytest.approx(0.1) and lr_at(9, t) == pytest.approx(1.0)
    assert lr_at(55, t) == pytest.approx(0.55)  # cosine halfway: floor + (1 - floor) / 2
    assert lr_at(100, t) == pytest.approx(0.1)


@pytest.mark.slow
def test_resume_from_step_15_is_exact(full_run, tmp_path):
    _, uninterrupted = full_run
    out = tmp_path / "run"
    first = train(preset("llama-2024-small", **TINY), TC, out, progress=False, stop_at=15)
    assert first["step"] == 15 and train_state.latest_checkpoint(out).name == "step-000015"
    resumed = train(None, None, out, resume=True, progress=False)
    # Same machine, same threads: the resumed run is the same computation, so equal exactly.
    assert _vals(resumed["history"]) == _vals(uninterrupted["history"])
    assert resumed["history"][-1]["train_loss"] == uninterrupted["history"][-1]["train_loss"]
    for a, b in zip(resumed["model"].state_dict().values(), uninterrupted["model"].state_dict().values(), strict=True):
        assert torch.equal(a, b)
    lines = (out / "log.jsonl").read_text().splitlines()
    assert [json.loads(x)["step"] for x in lines] == list(range(1, 31))


@pytest.mark.slow
def test_same_seed_same_curve(full_run, tmp_path):
    _, a = full_run
    b = train(preset("llama-2024-small", **TINY), TC, None, progress=False, stop_at=15)
    assert [r["train_loss"] for r in b["history"]] == [r["train_loss"] for r in a["history"][:15]]


@pytest.mark.slow
def test_killed_writer_leaves_previous_checkpoint_loadable(full_run, tmp_path, monkeypatch):
    src, _ = full_run
    out = tmp_path / "run"
    shutil.copytree(src, out)
    model, tok, state = load_trained(out)
    assert state["step"] == 30

    def dying_save_file(tensors, filename, metadata=None):
        with open(filename, "wb") as f:  # half a file, then the process "dies"
            f.write(b"\x00" * 100)
        raise KeyboardInterrupt

    monkeypatch.setattr(train_state, "save_file", dying_save_file)
    opt = torch.optim.AdamW(model.parameters())
    model(torch.zeros(1, 4, dtype=torch.long)).sum().backward()
    opt.step()
    with pytest.raises(KeyboardInterrupt):
        train_state.save_checkpoint(out, 31, model, opt, {"history": []})
    assert train_state.latest_checkpoint(out).name == "step-000030"
    again, _, state = load_trained(out)
    assert state["step"] == 30
    ids = torch.tensor([tok.encode("ROMEO:\n")])
    with torch.no_grad():
        assert torch.isfinite(again(ids)).all()


def test_resume_dir_without_checkpoint(tmp_path):
    with pytest.raises(FileNotFoundError, match="no checkpoint in"):
        train(None, None, tmp_path, resume=True, progress=False)


def test_context_longer_than_positions():
    with pytest.raises(ValueError, match="longer than the model's max_seq_len"):
        train(preset("gpt-2017-small", **TINY), TrainConfig(steps=1, context=64), None, progress=False)

"""Train short, test long: the experiment's plumbing (the measured numbers come from the full run)."""

import pytest
import torch

from llamablock.model import Decoder
from llamablock.presets import preset
from llamablock.studies.long_context import (
    _with_rope,
    bands,
    format_table,
    loss_by_position,
    rope_scaling_for,
    run_long_context,
)

SMALL = dict(vocab_size=65, d_model=32, n_layers=1, n_heads=4, n_kv_heads=2, d_ff=64, max_seq_len=16)


def test_scaling_changes_the_model_past_position_zero():
    m = Decoder(preset("llama-2024-small", **SMALL)).eval()
    ids = torch.randint(0, 65, (1, 64))
    base = m(ids)
    for method in ("linear", "ntk", "dynamic", "yarn"):
        scaled = _with_rope(m, rope_scaling_for(method, 4, 16))(ids)
        assert torch.equal(scaled[:, 0], base[:, 0]) or method == "yarn"  # position 0 is not rotated
        assert not torch.allclose(scaled[:, -1], base[:, -1]), method
    # dynamic leaves sequences within the original length exactly as trained (rope_scaling.py)
    short = ids[:, :16]
    assert torch.equal(_with_rope(m, rope_scaling_for("dynamic", 4, 16))(short), m(short))


def test_learned_positions_are_undefined_past_the_table():
    m = Decoder(preset("llama-2024-small", **{**SMALL, "position": "learned"}))
    ids = torch.arange(200) % 65
    assert len(loss_by_position(m, ids, 16, windows=2)) == 16
    with pytest.raises(ValueError, match="past the learned position table"):
        loss_by_position(m, ids, 32, windows=2)


def test_bands():
    assert bands([1.0] * 8 + [3.0] * 8, 8) == {"0-8": 1.0, "8-16": 3.0}


def test_tiny_run_has_every_curve_window_by_window():
    r = run_long_context(L=16, steps=2, finetune_steps=1, batch_size=2, windows=3,
                         size=dict(d_model=16, n_layers=1, n_heads=2, n_kv_heads=1), log=None)
    assert set(r["curves"]["learned"]) == {"16"}  # only where defined
    for m in ("none", "linear", "ntk", "dynamic", "yarn"):
        assert {"32", "64", "128"} <= set(r["curves"][f"rope {m}"])
        assert len(r["curves"][f"rope {m}"]["128"]) == 128
    assert set(r["curves"]["rope yarn + fine-tune"]) == {"64"}
    assert "rope linear + fine-tune" in format_table(r)
    # each curve kept window by window: the windows it is the mean of
    assert r["windows"] == 3 and r["window_curves"].keys() == r["curves"].keys()
    for name, per in r["curves"].items():
        for n, curve in per.items():
            rows = r["window_curves"][name][n]
            assert len(rows) == 3 and all(len(w) == int(n) for w in rows)
            assert max(abs(sum(w[i] for w in rows) / 3 - c) for i, c in enumerate(curve)) < 1e-12


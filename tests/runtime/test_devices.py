"""Device plumbing: everything a forward pass creates (caches, masks, positions, RoPE angles)
is made on the model's device. Checked on the meta device, which any CPU machine has and which
raises on the first tensor left on the CPU; the --device choices refuse what is not here."""

from __future__ import annotations

import pytest
import torch

from llamablock import Decoder, ModelConfig, cli
from llamablock.runtime.engine import EagerEngine
from llamablock.util.devices import resolve_device

CASES = [dict(position="rope", sliding_window=4), dict(position="rope", rope_scaling={"rope_type": "dynamic", "factor": 2.0}),
         dict(position="alibi"), dict(position="learned", norm="layernorm", norm_placement="post"),
         dict(position="sinusoidal")]


@pytest.mark.parametrize("kw", CASES, ids=lambda kw: kw["position"] + ("-dynamic" if "rope_scaling" in kw else ""))
def test_every_position_scheme_runs_on_the_models_device(kw):
    cfg = ModelConfig(vocab_size=50, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, max_seq_len=16, **kw)
    with torch.device("meta"):
        model = Decoder(cfg)
    engine = EagerEngine(model)
    engine.prepare(12)
    ids = torch.zeros(1, 5, dtype=torch.long, device="meta")
    assert engine.prefill(ids).device.type == "meta" and engine.step(ids[:, :1], 5).device.type == "meta"
    assert engine.cache.keys[0].device.type == "meta"
    pad = torch.ones(1, 5, dtype=torch.bool, device="meta")
    assert model(ids, pad_mask=pad).device.type == "meta"


def test_devices_that_are_not_here_are_refused(capsys):
    assert resolve_device("cpu") == "cpu" and resolve_device("auto") in ("cpu", "cuda", "mps")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="no CUDA device is available here"):
            resolve_device("cuda")
        assert cli.main(["generate", "--device", "cuda", "--prompt", "hi"]) == 2
        assert "no CUDA device" in capsys.readouterr().err

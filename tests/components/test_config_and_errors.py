"""Config validation, presets, transformers config round trips, and bad input everywhere:
each mistake gives an error whose message names the problem (asserted)."""

import json

import pytest
import torch
from hf_reference import tiny_hf_model

import llamablock
from llamablock import Decoder, ModelConfig, preset
from llamablock.io.hf_config import config_from_hf, config_to_hf
from llamablock.presets import PRESETS

BASE = dict(vocab_size=50, d_model=32, n_layers=1, n_heads=4)


@pytest.mark.parametrize("kw,message", [
    (dict(n_kv_heads=3), "n_heads (4) must be divisible by n_kv_heads (3)"),
    (dict(d_model=0), "d_model must be a positive integer, got 0"),
    (dict(n_layers=-1), "n_layers must be a positive integer, got -1"),
    (dict(head_dim=7), "rotary width must be even"),
    (dict(head_dim=12, partial_rotary_factor=0.25), "rotary width must be even"),
    (dict(norm="batchnorm"), "norm must be one of"),
    (dict(position="relative"), "position must be one of"),
    (dict(rope_theta=0.0), "rope_theta must be positive"),
    (dict(sliding_window=0), "sliding_window must be a positive integer"),
    (dict(rope_scaling={"rope_type": "magic"}), "rope_type 'magic' is unknown"),
])
def test_validation_names_the_field(kw, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        ModelConfig(**{**BASE, **kw})


def test_presets_build_and_the_small_pair_has_equal_parameters():
    for name in PRESETS:
        preset(name)  # validates
    old, new = Decoder(preset("gpt-2017-small")), Decoder(preset("llama-2024-small"))
    a, b = old.num_parameters(), new.num_parameters()
    assert abs(a - b) / max(a, b) < 0.02
    with pytest.raises(ValueError, match="unknown preset 'llama-9'"):
        preset("llama-9")


@pytest.mark.parametrize("name", ["llama-3-8b", "llama-3.1-8b", "mistral-7b", "qwen2.5-0.5b", "gemma-2b", "smollm2-135m-instruct"])
def test_presets_round_trip_through_transformers_config(name):
    import transformers

    cfg = preset(name)
    hf = transformers.AutoConfig.for_model(**config_to_hf(cfg))
    back = config_from_hf(hf.to_dict())
    assert back.to_dict() | {"extra": {}} == cfg.to_dict() | {"extra": {}}


def test_from_hf_reads_v4_rope_scaling_form():
    v4 = dict(model_type="llama", vocab_size=10, hidden_size=32, num_hidden_layers=1, num_attention_heads=4,
              intermediate_size=64, rope_theta=500000.0,
              rope_scaling={"type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                            "original_max_position_embeddings": 8192})
    cfg = config_from_hf(v4)
    assert cfg.rope_theta == 500000.0 and cfg.rope_scaling["rope_type"] == "llama3"


def test_unknown_family_is_refused():
    with pytest.raises(ValueError, match="model_type 'falcon' is not supported"):
        config_from_hf({"model_type": "falcon", "hidden_size": 8})


def test_token_out_of_vocabulary():
    model = Decoder(ModelConfig(**BASE))
    with pytest.raises(ValueError, match="token id 50 is out of range for a vocabulary of 50"):
        model(torch.tensor([[1, 50]]))
    with pytest.raises(ValueError, match="token id -1 is out of range"):
        model(torch.tensor([[-1]]))


def test_sequence_past_learned_position_table():
    model = Decoder(ModelConfig(**BASE, position="learned", max_seq_len=8))
    model(torch.zeros(1, 8, dtype=torch.long))
    with pytest.raises(ValueError, match="position 8 is past the learned position table"):
        model(torch.zeros(1, 9, dtype=torch.long))


def test_cache_overflow_is_clear():
    cfg = ModelConfig(**BASE)
    model = Decoder(cfg)
    cache = llamablock.KVCache(cfg, 1, max_len=4)
    with pytest.raises(ValueError, match="KV cache is full"):
        model(torch.zeros(1, 5, dtype=torch.long), cache=cache)


def test_truncated_safetensors(tmp_path):
    tiny_hf_model("llama").save_pretrained(tmp_path)
    f = tmp_path / "model.safetensors"
    f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])
    with pytest.raises(ValueError, match="model.safetensors is not a readable safetensors file"):
        llamablock.load_pretrained(tmp_path)


def test_missing_unused_and_misshaped_tensors(tmp_path):
    from safetensors.torch import load_file, save_file

    tiny_hf_model("llama").save_pretrained(tmp_path)
    f = tmp_path / "model.safetensors"
    good = load_file(f)
    save_file({k: v for k, v in good.items() if k != "model.norm.weight"}, f)
    with pytest.raises(ValueError, match="lacks tensor 'model.norm.weight'"):
        llamablock.load_pretrained(tmp_path)
    save_file({**good, "model.extra.weight": torch.zeros(2)}, f)
    with pytest.raises(ValueError, match="tensors the model does not use: \\['model.extra.weight'\\]"):
        llamablock.load_pretrained(tmp_path)
    save_file({**good, "model.norm.weight": torch.zeros(3)}, f)
    with pytest.raises(ValueError, match="'model.norm.weight' has shape \\(3,\\), the config implies \\(32,\\)"):
        llamablock.load_pretrained(tmp_path)


def test_unknown_family_in_checkpoint(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gpt_neox"}))
    with pytest.raises(ValueError, match="model_type 'gpt_neox' is not supported"):
        llamablock.load_pretrained(tmp_path)


def test_cli_demo_and_one_line_error(capsys):
    from llamablock.cli import main

    assert main(["demo", "--tokens", "8"]) == 0
    assert "parameters" in capsys.readouterr().out
    assert main(["demo", "--tokens", "0"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["llamablock demo: error: --tokens must be in 1..256, got 0"]


def test_static_ntk_exports_as_default_rope_at_the_raised_base():
    """transformers has no "ntk" type; the export must load there and give the same frequencies."""
    import transformers
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    from llamablock.rope_scaling import rope_frequencies

    cfg = preset("smollm2-135m-instruct", rope_scaling={"rope_type": "ntk", "factor": 4.0})
    hf = transformers.LlamaConfig(**{k: v for k, v in config_to_hf(cfg).items() if k not in ("model_type", "architectures")})
    ours, _ = rope_frequencies(cfg)
    ref = LlamaRotaryEmbedding(hf).inv_freq
    assert torch.allclose(ours, ref, rtol=1e-6, atol=0)

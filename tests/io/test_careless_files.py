"""Files that transformers or llama.cpp refuse are refused here too, each by the field or tensor at fault.

Each case is a tiny file written by the test with one thing wrong, as a careless or hostile writer
would leave it: GGUF metadata of the wrong type (llama.cpp reads each key with its type), shapes
that disagree, a family's settings out of range (transformers' config validation), a tensor stored
twice with different values or as integers. The reference for "what transformers computes" is
transformers itself (the Qwen 2 window case, logits to 1e-4).
"""

from __future__ import annotations

import json
import math

import gguf
import numpy as np
import pytest
import torch
from gguf_families_tiny import write_family_gguf
from gguf_tiny import write_tiny_gguf
from hf_reference import max_logit_gap_at_offsets, tiny_hf_model
from safetensors.torch import load_file, save_file

import llamablock
from llamablock import cli
from llamablock.io.gguf import config_from_gguf, open_gguf

F32, STRING, ARRAY, UINT32 = (gguf.GGUFValueType.FLOAT32, gguf.GGUFValueType.STRING, gguf.GGUFValueType.ARRAY,
                              gguf.GGUFValueType.UINT32)


def _changing(monkeypatch, meta: dict | None = None, tensors: dict | None = None):
    """The gguf writer with metadata keys replaced (key -> (value, type[, sub type])) and tensors
    replaced (name -> array) or left out (name -> None), before the header counts them."""
    write_header, add_tensor = gguf.GGUFWriter.write_header_to_file, gguf.GGUFWriter.add_tensor

    def header(self, *args, **kwargs):
        for key, value in (meta or {}).items():
            self.kv_data[0][key] = gguf.GGUFValue(*value)
        write_header(self, *args, **kwargs)

    def tensor(self, name, arr, *args, **kwargs):
        if tensors and name in tensors:
            if tensors[name] is None:
                return None
            arr = tensors[name]
        return add_tensor(self, name, arr, *args, **kwargs)

    monkeypatch.setattr(gguf.GGUFWriter, "write_header_to_file", header)
    monkeypatch.setattr(gguf.GGUFWriter, "add_tensor", tensor)


LLAMA_META = {  # key -> (value, type), expected words of the refusal
    "string-epsilon": ({"llama.attention.layer_norm_rms_epsilon": ("1e-5", STRING)},
                       "llama.attention.layer_norm_rms_epsilon must be a finite number, got '1e-5'"),
    "string-base": ({"llama.rope.freq_base": ("10000", STRING)}, "llama.rope.freq_base must be a finite number"),
    "string-rotary-width": ({"llama.rope.dimension_count": ("8", STRING)},
                            "llama.rope.dimension_count must be an integer, got '8'"),
    "array-base": ({"llama.rope.freq_base": ([10000.0], ARRAY)},
                   "llama.rope.freq_base must be a single number, the file holds an array"),
    "value-width": ({"llama.attention.value_length": (4, UINT32)},
                    "llama.attention.value_length (4) differs from llama.attention.key_length (8)"),
    "rotary-width-zero": ({"llama.rope.dimension_count": (0, UINT32)},
                          "llama.rope.dimension_count must be an even number of features in 1..8"),
    "rotary-width-past-head": ({"llama.rope.dimension_count": (16, UINT32)},
                               "llama.rope.dimension_count must be an even number of features in 1..8 (the head "
                               "width), got 16"),
    "vocab-zero": ({"llama.vocab_size": (0, UINT32)}, "llama.vocab_size must be positive, got 0"),
}


@pytest.mark.parametrize("case", LLAMA_META)
def test_gguf_metadata_of_the_wrong_type_or_range_is_refused_by_key(tmp_path, monkeypatch, case):
    meta, words = LLAMA_META[case]
    _changing(monkeypatch, meta)
    f = tmp_path / f"{case}.gguf"
    write_tiny_gguf(f, tiny_hf_model("llama", n_heads=4, n_kv=2))
    with pytest.raises(ValueError, match="GGUF metadata") as e:
        config_from_gguf(open_gguf(f))
    assert words in str(e.value)


def test_the_command_line_says_it_in_one_line(tmp_path, monkeypatch, capsys):
    _changing(monkeypatch, LLAMA_META["string-epsilon"][0])
    f = tmp_path / "eps.gguf"
    write_tiny_gguf(f, tiny_hf_model("llama", n_heads=4, n_kv=2))
    assert cli.main(["generate", "--model", str(f), "--prompt", "abc"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "layer_norm_rms_epsilon must be a finite number" in err


def test_gemma3_local_base_as_an_array_is_refused(tmp_path, monkeypatch):
    _changing(monkeypatch, {"gemma3.rope.freq_base_swa": ([10000.0], ARRAY)})
    f = tmp_path / "g3.gguf"
    write_family_gguf(f, tiny_hf_model("gemma3_text", n_heads=4, n_kv=2, sliding_window=6), "gemma3_text")
    with pytest.raises(ValueError, match="gemma3.rope.freq_base_swa must be a single number"):
        config_from_gguf(open_gguf(f))


def test_one_missing_q_norm_is_named(tmp_path, monkeypatch):
    """Only blk.0 lacks its q norm: the message names that tensor, not an unused k norm."""
    _changing(monkeypatch, tensors={"blk.0.attn_q_norm.weight": None})
    f = tmp_path / "q3.gguf"
    write_family_gguf(f, tiny_hf_model("qwen3", n_heads=4, n_kv=2), "qwen3")
    with pytest.raises(ValueError, match=r"lacks tensor 'blk\.0\.attn_q_norm\.weight'"):
        config_from_gguf(open_gguf(f))


LONG = dict(rope_parameters={"rope_type": "longrope", "rope_theta": 10000.0, "short_factor": [1.0, 1.3, 2.0, 4.0],
                             "long_factor": [1.5, 3.0, 7.0, 16.0]},
            original_max_position_embeddings=16, max_position_embeddings=4096)


def test_longrope_factors_holding_infinity_are_refused_in_gguf(tmp_path, monkeypatch):
    _changing(monkeypatch, tensors={"rope_factors_long.weight": np.array([1.5, 3.0, np.inf, 16.0], np.float32)})
    f = tmp_path / "phi3.gguf"
    write_family_gguf(f, tiny_hf_model("phi3", n_heads=4, n_kv=2, **LONG), "phi3")
    with pytest.raises(ValueError, match="long_factor must hold positive finite numbers"):
        config_from_gguf(open_gguf(f))


def _edit_config(d, **changes):
    cfg = json.loads((d / "config.json").read_text())
    for k, v in changes.items():
        if k.startswith("rope."):
            cfg["rope_parameters"][k[5:]] = v
        else:
            cfg[k] = v
    (d / "config.json").write_text(json.dumps(cfg))  # json writes inf as Infinity, as a careless writer might


CONFIGS = {
    "layer-types-too-long": ("qwen2", {}, {"layer_types": ["full_attention"] * 3}, "layer_types must list"),
    "layer-types-unknown": ("gemma2", {}, {"layer_types": ["full_attention", "chunked_attention"]}, "layer_types must list"),
    "layer-types-without-window": ("qwen2", {}, {"layer_types": ["full_attention"] * 5}, "layer_types must list"),
    "pattern-zero": ("gemma3_text", {}, {"sliding_window_pattern": 0, "layer_types": None},
                     "sliding_window_pattern must be a positive integer"),
    "pattern-negative": ("gemma3_text", {}, {"sliding_window_pattern": -6, "layer_types": None},
                         "sliding_window_pattern must be a positive integer"),
    "longrope-infinity": ("phi3", LONG, {"rope.long_factor": [1.5, 3.0, math.inf, 16.0]},
                          "long_factor must hold positive finite numbers"),
}


@pytest.mark.parametrize("case", CONFIGS)
def test_configs_transformers_refuses_are_refused(tmp_path, case):
    family, kw, changes, words = CONFIGS[case]
    tiny_hf_model(family, n_heads=4, n_kv=2, **kw).save_pretrained(tmp_path)
    _edit_config(tmp_path, **changes)
    with pytest.raises(ValueError, match=words):
        llamablock.load_pretrained(tmp_path)


def test_qwen2_with_a_null_window_has_no_window_as_in_transformers(tmp_path):
    """use_sliding_window true, sliding_window null, no layer_types (a hand-written config.json):
    transformers attends over everything (it derives all-full layer types from the null window).
    A default window of 4096 would not show at 24 tokens, so the config is checked too."""
    hf = tiny_hf_model("qwen2", n_heads=4, n_kv=2, use_sliding_window=True, sliding_window=None, max_window_layers=0)
    hf.save_pretrained(tmp_path)
    _edit_config(tmp_path, layer_types=None)
    ours = llamablock.load_pretrained(tmp_path)
    assert ours.cfg.sliding_window is None
    assert max_logit_gap_at_offsets(hf, ours) <= 1e-4


@pytest.mark.parametrize("dtype", [torch.int64, torch.bool])
def test_a_norm_stored_as_integers_is_refused(tmp_path, dtype):
    tiny_hf_model("llama", n_heads=4, n_kv=2).save_pretrained(tmp_path)
    f = tmp_path / "model.safetensors"
    tensors = load_file(f)
    tensors["model.norm.weight"] = tensors["model.norm.weight"].to(dtype)
    save_file(tensors, f)
    with pytest.raises(ValueError, match=f"'model.norm.weight' is stored as {dtype}"):
        llamablock.load_pretrained(tmp_path)


@pytest.mark.parametrize("same", [True, False])
def test_a_tensor_in_two_shards(tmp_path, same):
    """Held twice with the same values: loads; with different values: refused naming both shards."""
    tiny_hf_model("llama", n_heads=4, n_kv=2).save_pretrained(tmp_path)
    tensors = load_file(tmp_path / "model.safetensors")
    (tmp_path / "model.safetensors").unlink()
    names = sorted(tensors)
    first = {k: tensors[k] for k in names[: len(names) // 2]}
    second = {k: tensors[k] for k in names[len(names) // 2:]}
    second["model.norm.weight"] = tensors["model.norm.weight"] + (0 if same else 1)
    save_file(first | {"model.norm.weight": tensors["model.norm.weight"]}, tmp_path / "a.safetensors")
    save_file(second, tmp_path / "b.safetensors")
    index = {"weight_map": {**{k: "a.safetensors" for k in first}, **{k: "b.safetensors" for k in second}}}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    if same:
        llamablock.load_pretrained(tmp_path)
    else:
        with pytest.raises(ValueError, match=r"'model.norm.weight' is in both a.safetensors and b.safetensors"):
            llamablock.load_pretrained(tmp_path)


@pytest.mark.parametrize("key", ["tokenizer.ggml.scores", "tokenizer.ggml.token_type"])
def test_per_token_arrays_shorter_than_the_vocabulary_are_refused(tmp_path, monkeypatch, key):
    from test_tokenizer import _spm_gguf

    from llamablock.io.tokenizer import tokenizer_from_gguf

    real = gguf.GGUFWriter.add_key_value

    def shorter(self, k, val, *args, **kwargs):  # the writer's own call, one entry short
        return real(self, k, val[:-1] if k == key else val, *args, **kwargs)

    monkeypatch.setattr(gguf.GGUFWriter, "add_key_value", shorter)
    f = tmp_path / "spm.gguf"
    _spm_gguf(f)
    with pytest.raises(ValueError, match=f"{key} has 284 entries for 285 tokens"):
        tokenizer_from_gguf(open_gguf(f))
